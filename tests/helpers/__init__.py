"""What the tests import: helpers in plain modules (`from helpers.trees import
write_tree`).  Fixtures live in the conftest.py of the folder whose tests use them
(tests/conftest.py for those of several folders); nothing imports a conftest.py."""
