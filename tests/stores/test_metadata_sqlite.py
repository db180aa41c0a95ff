import pytest

from tests.stores.metadata_contract import MetadataContract


class TestSqliteMetadata(MetadataContract):
    @pytest.fixture
    def store_url(self, tmp_path) -> str:
        return f"sqlite://{tmp_path}/metadata.db"
