"""``python -m zones``: the same command line as ``zones``."""
import sys

from zones.cli import main

sys.exit(main())
