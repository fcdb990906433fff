"""Weight formats: how a layer holds its weight and multiplies by it (see base.py)."""
