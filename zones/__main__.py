"""``python -m zones``: the same command line as ``zones``."""
import sys

from .cli import main

sys.exit(main())
