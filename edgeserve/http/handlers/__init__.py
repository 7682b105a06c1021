"""One module per endpoint: bytes → validation → engine → responses."""
