"""A job whose file names, stage names and arguments hold Rich markup and HTML.

``markup_names.py DIR [ARGS...]`` writes and reads a file under DIR whose path holds ``[/x]``,
``[bold]``, ``<script>`` and ``&``, in two stages whose names hold markup too, with a few steps
marked by holoprof.step(). The arguments are not used: they only appear in the command line.
"""

import os
import sys

import holoprof

#: The file the job reads, under DIR: every kind of text a renderer could take for markup.
NAME = os.path.join("in[bold]", "a[/x]<script>alert(1)</script>&amp;.bin")
STAGES = ("prepare [red]<b>", "train [/x]&")


def main() -> None:
    path = os.path.join(sys.argv[1], NAME)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with holoprof.stage(STAGES[0]), open(path, "wb") as f:
        f.write(os.urandom(64 * 1024))
    with holoprof.stage(STAGES[1]):
        for _ in range(4):
            with open(path, "rb") as f:
                while f.read(8192):
                    pass
            holoprof.step()


if __name__ == "__main__":
    main()
