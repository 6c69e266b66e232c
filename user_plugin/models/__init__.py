"""Models of the plugin. fairseq imports every module here when it loads ``--user-dir``."""

from .vaswani_transformer import VaswaniTransformerModel  # noqa: F401  (registers the model)
from .architectures import vaswani_base, vaswani_big, vaswani_big_en_fr  # noqa: E402,F401,I001
from . import table3_architectures  # noqa: E402,F401  (Table 3 variants)
