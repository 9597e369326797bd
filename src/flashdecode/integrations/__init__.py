"""Integrations of flashdecode with model libraries. Each submodule imports its library on import; this package
imports nothing."""
