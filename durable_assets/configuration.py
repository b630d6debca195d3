"""The README's Configuration table: every section of every layer and of this project's pipelines.

Each layer and pipeline declares its own variables next to its code (see
:mod:`durable_assets.settings`); this module only collects them, in the order the README lists
them, so the one table is still generated and checked (tests/test_settings.py). Like
:mod:`durable_assets.definitions` it sits above every layer and may import each of them; nothing
in the package imports it.

``python -m durable_assets.configuration`` prints the table.
"""

from __future__ import annotations

from durable_assets.credit_migration.settings import CreditMigrationSettings
from durable_assets.kit.runtime import CrashHooks, DistributedSettings, KitSettings, StorageSettings
from durable_assets.ops.settings import (
    ApiSettings,
    AutoResumeSettings,
    ProgressSettings,
    RetentionSettings,
    WebhookVariables,
)
from durable_assets.payments.settings import PaymentSettings
from durable_assets.refunds.settings import RefundSettings
from durable_assets.settings import InstanceSettings, Section, markdown_table

#: Every section, in the README's order: the instance, the provider, the kit, the operations
#: layer, then each pipeline's own. The test hooks come last and stay out of the table.
SECTIONS: tuple[type[Section], ...] = (
    InstanceSettings,
    PaymentSettings,
    KitSettings,
    DistributedSettings,
    StorageSettings,
    ProgressSettings,
    AutoResumeSettings,
    ApiSettings,
    RetentionSettings,
    WebhookVariables,
    RefundSettings,
    CreditMigrationSettings,
    CrashHooks,
)


def readme_table() -> str:
    """The README's Configuration table."""
    return markdown_table(SECTIONS)


if __name__ == "__main__":
    print(readme_table())
