"""The credit migration: legacy prepaid credit into payment-provider customer balances (docs/contract.md)."""
