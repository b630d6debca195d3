"""The currencies Stripe accepts in a ``currency`` parameter, so the store refuses what Stripe refuses.

Source: Stripe's "Supported currencies" page (https://docs.stripe.com/currencies), its list of
presentment currencies (the 134 codes of its section "Supported presentment currencies", read in
2024) plus the five of its section "Three-decimal currencies" (BHD, JOD, KWD, OMR, TND), as Stripe's
own 400 ``Invalid currency: xyz. Stripe currently supports these currencies: usd, aed, ...``
names them. Which of them an account may charge in depends on its country; the simulator is one
US test account that accepts them all. Stripe adds a currency now and then: add it here when a
client needs it (a wrong refusal is visible at once, a wrong acceptance is not).
"""

from __future__ import annotations

from typing import Final

#: Lowercase, as Stripe spells them in API requests and answers; ``usd`` first as in Stripe's message.
STRIPE_CURRENCIES: Final[tuple[str, ...]] = (
    "usd", "aed", "afn", "all", "amd", "ang", "aoa", "ars", "aud", "awg", "azn", "bam", "bbd", "bdt",
    "bgn", "bhd", "bif", "bmd", "bnd", "bob", "brl", "bsd", "bwp", "byn", "bzd", "cad", "cdf", "chf",
    "clp", "cny", "cop", "crc", "cve", "czk", "djf", "dkk", "dop", "dzd", "egp", "etb", "eur", "fjd",
    "fkp", "gbp", "gel", "gip", "gmd", "gnf", "gtq", "gyd", "hkd", "hnl", "htg", "huf", "idr", "ils",
    "inr", "isk", "jmd", "jod", "jpy", "kes", "kgs", "khr", "kmf", "krw", "kwd", "kyd", "kzt", "lak",
    "lbp", "lkr", "lrd", "lsl", "mad", "mdl", "mga", "mkd", "mmk", "mnt", "mop", "mur", "mvr", "mwk",
    "mxn", "myr", "mzn", "nad", "ngn", "nio", "nok", "npr", "nzd", "omr", "pab", "pen", "pgk", "php",
    "pkr", "pln", "pyg", "qar", "ron", "rsd", "rub", "rwf", "sar", "sbd", "scr", "sek", "sgd", "shp",
    "sle", "sos", "srd", "std", "szl", "thb", "tjs", "tnd", "top", "try", "ttd", "twd", "tzs", "uah",
    "ugx", "uyu", "uzs", "vnd", "vuv", "wst", "xaf", "xcd", "xof", "xpf", "yer", "zar", "zmw",
)  # fmt: skip
SUPPORTED: Final[frozenset[str]] = frozenset(STRIPE_CURRENCIES)


def unsupported_message(currency: str) -> str:
    """Stripe's wording for a currency it does not know, the list included (clients log it as is)."""
    supported = ", ".join(STRIPE_CURRENCIES)
    return f"Invalid currency: {currency}. Stripe currently supports these currencies: {supported}"
