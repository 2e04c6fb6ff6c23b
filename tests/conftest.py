import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
# Keep failures fast in tests; individual tests set their own where they need to.
os.environ.setdefault("HARP_TIMEOUT", "60")
