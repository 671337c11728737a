"""MkDocs hooks for the documentation site (mkdocs.yml): links from a page to files outside
docs/ (the raw results in benchmarks/results/, the examples, the repository README) are checked
and served. Each such target must exist, else the strict build fails; it is copied into the site
under `repo/` (markdown and code as plain text, images as they are) and the link rewritten to
the copy. Links inside code are left alone."""

import logging
import os
import posixpath
import re

from mkdocs.structure.files import File

log = logging.getLogger("mkdocs.hooks.docs_hooks")

FENCE = re.compile(r"^( *)(```|~~~).*?^\1\2[ \t]*$", re.M | re.S)
INLINE_CODE = re.compile(r"`(?:[^`\n]|\n(?![ \t]*\n))*`")
LINK = re.compile(r"(!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?)([^)\s>]+)")
SCHEME = re.compile(r"^[a-z][a-z0-9+.-]*:", re.I)
SERVED_AS_IS = {".png", ".jpg", ".jpeg", ".svg", ".gif"}
PREFIX = "repo"

_outside = {}  # repository-relative path -> absolute path, gathered before the pages render


def _root(config):
    return os.path.dirname(os.path.abspath(config["config_file_path"]))


def _copy_name(relative):
    """The site path of repository file `relative`: text files get `.txt` so they are served
    as text, not rendered."""
    extension = os.path.splitext(relative)[1].lower()
    suffix = "" if extension in SERVED_AS_IS else ".txt"
    return posixpath.join(PREFIX, relative + suffix)


def _masked(text):
    """`text` with fenced blocks and inline code blanked out (same length, so positions hold)."""
    blank = lambda match: re.sub(r"[^\n]", " ", match.group(0))
    return INLINE_CODE.sub(lambda m: "x" * len(m.group(0)), FENCE.sub(blank, text))


def _outside_targets(page_path, text, docs_dir, root):
    """(match span, target, repository-relative path) of each link of the page at `page_path`
    whose target lies outside `docs_dir`."""
    for match in LINK.finditer(_masked(text)):
        if True:
            target = text[match.start(2):match.end(2)]
            if SCHEME.match(target) or target.startswith("#"):
                continue
            file_part = target.split("#", 1)[0].split("?", 1)[0]
            resolved = os.path.normpath(os.path.join(os.path.dirname(page_path), file_part))
            if resolved == docs_dir or resolved.startswith(docs_dir + os.sep):
                continue
            yield match.span(2), target, os.path.relpath(resolved, root)


def on_files(files, config):
    """Adds the repository files that pages link to outside docs/ to the site."""
    docs_dir, root = os.path.abspath(config["docs_dir"]), _root(config)
    _outside.clear()
    for page in [f for f in files if f.src_uri.endswith(".md")]:
        with open(page.abs_src_path, encoding="utf-8") as handle:
            text = handle.read()
        for _, _, relative in _outside_targets(page.abs_src_path, text, docs_dir, root):
            absolute = os.path.join(root, relative)
            if os.path.isfile(absolute) and not relative.startswith(".."):
                _outside[relative] = absolute
    for relative, absolute in sorted(_outside.items()):
        files.append(File.generated(config, _copy_name(relative), abs_src_path=absolute))
    return files


def on_page_markdown(markdown, page, config, files):
    """Rewrites each link out of docs/ to the site's copy; a warning (an error under
    `--strict`) for a target that is missing or a folder."""
    docs_dir, root = os.path.abspath(config["docs_dir"]), _root(config)
    edits = []
    for span, target, relative in _outside_targets(page.file.abs_src_path, markdown, docs_dir,
                                                   root):
        if relative not in _outside:
            log.warning("%s links to %s, which is not a file in the repository",
                        page.file.src_uri, target)
            continue
        anchor = target[len(target.split("#", 1)[0]):]
        copy = _copy_name(relative)
        edits.append((span, posixpath.relpath(copy, posixpath.dirname(page.file.src_uri))
                      + ("" if copy.endswith(".txt") else anchor)))
    for (start, end), new in reversed(edits):
        markdown = markdown[:start] + new + markdown[end:]
    return markdown
