import sys

from hf_tpu_ext.cli import main

if __name__ == "__main__":
    sys.exit(main())
