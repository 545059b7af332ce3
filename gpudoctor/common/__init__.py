"""The shared floor: what every layer may import (safe file access, redaction, errors, words, hardware).

Stdlib only at import time: the injected hooks import ``safefs`` inside the patient's interpreter.
"""
