"""Integrations of fa4 with other libraries (import the submodule to register)."""
