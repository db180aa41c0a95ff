import pytest

from tests.stores.metadata_contract import MetadataContract

pytestmark = pytest.mark.etcd


class TestEtcdMetadata(MetadataContract):
    @pytest.fixture
    def store_url(self, etcd_server, etcd_root) -> str:
        return f"{etcd_server.url}{etcd_root}"

    @pytest.fixture
    def private_store_url(self, compactable_etcd_server, etcd_root) -> str:
        return f"{compactable_etcd_server.url}{etcd_root}"
