"""What the tests share, imported as `helpers.<module>` (pyproject's pytest `pythonpath` holds tests/).

conftest.py files hold only fixtures and hooks; test modules never import them. tests/conftest.py
registers this package for pytest's assertion rewriting before anything imports it.
"""
