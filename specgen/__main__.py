"""`python -m specgen ...` is the `specgen` command."""
import sys

from .cli import main

sys.exit(main())
