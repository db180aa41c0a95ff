import pytest

from tests.stores.objects_contract import ObjectsContract
from tiered.objects import open_objects


class TestLocalObjects(ObjectsContract):
    @pytest.fixture
    def objects(self, tmp_path):
        return open_objects(f"file://{tmp_path}/objects")
