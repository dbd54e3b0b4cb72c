import pytest

# The contract suite lives in a helper module shared by several test modules.
pytest.register_assert_rewrite("tests.aggregates.contract", "tests.aggregates.domain")
