"""Models of the plugin. fairseq imports every module here when it loads ``--user-dir``."""

from . import table3_architectures  # noqa: F401  (Table 3 variants)
from .architectures import vaswani_base, vaswani_big, vaswani_big_en_fr  # noqa: F401
from .parsing_architectures import vaswani_parsing_wsj  # noqa: F401  (§6.3)
from .vaswani_transformer import VaswaniTransformerModel  # noqa: F401
