import pytest

from tests.stores.objects_contract import ObjectsContract
from tiered.objects import open_objects

pytestmark = pytest.mark.s3


class TestS3Objects(ObjectsContract):
    @pytest.fixture
    def objects(self, moto_server, s3_bucket):
        store = open_objects(f"s3://{s3_bucket}/some/prefix?endpoint={moto_server.endpoint_url}&multipart_threshold_bytes={6 << 20}&part_size_bytes={5 << 20}")
        yield store
        store.close()
