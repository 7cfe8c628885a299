"""A user's own sitecustomize: it must still run when holoprof puts its own first on PYTHONPATH."""

import os

marker = os.environ.get("USER_SITECUSTOMIZE_MARKER")
if marker:
    with open(marker, "a") as f:
        f.write(f"{os.getpid()}\n")
print("user sitecustomize ran", flush=True)
