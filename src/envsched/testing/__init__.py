"""Test helpers that users need too: stand-ins for external services, for CPU runs and tests only."""
