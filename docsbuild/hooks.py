"""MkDocs hooks (mkdocs.yml `hooks:`): the generated pages join the build; markers in pages are filled in.

Generated at build time, so no committed page can fall behind the code: a setting, metric, command,
route, rule or runbook another change adds is in the next build without an edit here.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # `mkdocs build` run from the checkout: the product and this package import
    sys.path.insert(0, str(ROOT))

from mkdocs.structure.files import File, Files  # noqa: E402

from docsbuild import reference  # noqa: E402


def on_files(files: Files, config: Any) -> Files:
    """Add the on-call pages: the index, one page per shipped alert rule and per shipped runbook."""
    for path, content in reference.generated_pages().items():
        files.append(File.generated(config, path, content=content))
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Files) -> str:
    """Replace each `<!-- generated: ... -->` marker with what the code says today."""
    for marker, render in reference.MARKERS.items():
        if marker in markdown:
            markdown = markdown.replace(marker, render())
    return markdown
