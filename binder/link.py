"""Print the Binder link of this repository, built from where it really lives.

    python binder/link.py            # from `git remote get-url origin`
    python binder/link.py URL        # from a remote URL you give

Binder (mybinder.org) builds the course from `binder/` and opens JupyterLab on the tour,
`chapters/00_tour.ipynb`. It needs the repository's public GitHub location, which only the clone
knows, so the README has no badge with a made-up owner: run this to get the link for your fork or
copy.
"""
from __future__ import annotations

import re
import subprocess
import sys

BINDER = "https://mybinder.org/v2/gh/{owner}/{name}/HEAD?urlpath=lab/tree/chapters/00_tour.ipynb"
GITHUB_REMOTE = re.compile(r"^(?:https://(?:[^@/]+@)?github\.com/|git@github\.com:|"
                           r"ssh://git@github\.com/)([\w.-]+)/([\w.-]+?)(?:\.git)?/?$")


def binder_link(remote_url: str) -> str:
    """The Binder link for a GitHub remote URL (https or ssh); ValueError for any other."""
    match = GITHUB_REMOTE.match(remote_url.strip())
    if match is None:
        raise ValueError(f"{remote_url.strip()!r} is not a GitHub repository URL: Binder builds "
                         "from public GitHub repositories (push the course there first)")
    return BINDER.format(owner=match.group(1), name=match.group(2))


def origin_url() -> str:
    done = subprocess.run(["git", "remote", "get-url", "origin"], capture_output=True, text=True)
    if done.returncode != 0:
        raise ValueError("this clone has no remote named origin: give the repository's GitHub "
                         "URL, e.g. python binder/link.py https://github.com/OWNER/tinyteach")
    return done.stdout.strip()


def main(argv: list[str]) -> int:
    try:
        print(binder_link(argv[0] if argv else origin_url()))
    except ValueError as error:
        print(f"binder/link.py: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
