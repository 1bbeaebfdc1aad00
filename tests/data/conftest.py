"""The data tests use the shared dataset and Azurite fixtures in tests/conftest.py."""
