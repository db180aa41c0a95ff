import pytest

from tests.stores.objects_contract import ObjectsContract
from tiered.objects import open_objects

pytestmark = pytest.mark.s3


class TestS3Objects(ObjectsContract):
    @pytest.fixture
    def objects_url(self, moto_server, s3_bucket) -> str:
        return (f"s3://{s3_bucket}/some/prefix?endpoint={moto_server.endpoint_url}"
                f"&multipart_threshold_bytes={6 << 20}&part_size_bytes={5 << 20}")

    @pytest.fixture
    def objects(self, objects_url):
        store = open_objects(objects_url)
        yield store
        store.close()
