"""The credit migration: legacy prepaid credit into payment-provider customer balances (CONTRACT.md)."""
