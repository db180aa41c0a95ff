"""docs/FORMAT.md mirrors the spec docstrings exactly."""
from native import docs_sync


def test_format_md_mirrors_the_spec_docstrings():
    assert docs_sync.FORMAT_MD.read_text() == docs_sync.render(), (
        "docs/FORMAT.md drifted from the spec docstrings; run "
        "python -c \"import native.docs_sync as d; d.write()\"")
