"""``python -m kfca_llm.cli`` (what ``accelerate launch -m kfca_llm.cli simulate`` runs)."""

import sys

from . import main

sys.exit(main())
