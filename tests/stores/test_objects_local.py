import pytest

from tests.stores.objects_contract import ObjectsContract
from tiered.objects import open_objects


class TestLocalObjects(ObjectsContract):
    @pytest.fixture
    def objects_url(self, tmp_path) -> str:
        return f"file://{tmp_path}/objects"

    @pytest.fixture
    def objects(self, objects_url):
        return open_objects(objects_url)
