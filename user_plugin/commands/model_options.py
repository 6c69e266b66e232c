"""Print the options of the plugin's model, criterion, scheduler, optimizer and task with help and
defaults.

``fairseq-train --help`` prints before fairseq adds an architecture's options, so this lists
what ``--arch vaswani_*``, ``--criterion vaswani_label_smoothed_cross_entropy``,
``--lr-scheduler vaswani_inverse_sqrt``, ``--optimizer vaswani_adam`` and ``--task
vaswani_translation`` accept. ``--arch NAME`` shows the defaults of that architecture (the
model's options as the architecture sets them); an architecture that is not the plugin's is
refused.
"""

import argparse
import dataclasses
import sys
from collections.abc import Sequence


def our_architectures() -> list[str]:
    """The architectures the plugin registers (of its model ``vaswani_transformer`` and of the
    models built on it)."""
    from fairseq.models import ARCH_MODEL_REGISTRY

    from user_plugin.models.vaswani_transformer import VaswaniTransformerModel

    return sorted(name for name, model in ARCH_MODEL_REGISTRY.items()
                  if issubclass(model, VaswaniTransformerModel))


def architecture_defaults(arch: str) -> dict:
    """The model options as architecture ``arch`` sets them."""
    from fairseq.models import ARCH_CONFIG_REGISTRY

    options = argparse.Namespace()
    ARCH_CONFIG_REGISTRY[arch](options)
    return vars(options)


def main(argv: Sequence[str] | None = None) -> int:
    """Print the options; returns the exit status (argparse refuses an unknown ``--arch``)."""
    from fairseq.dataclass.utils import gen_parser_from_dataclass

    from user_plugin.registration import register

    register()
    from user_plugin.criterions.label_smoothed_cross_entropy import (
        LabelSmoothedCrossEntropyConfig,
    )
    from user_plugin.lr_schedulers.inverse_sqrt_warmup import InverseSqrtWarmupConfig
    from user_plugin.models.transformer_config import VaswaniTransformerConfig
    from user_plugin.optimizers.multi_tensor_adam import MultiTensorAdamConfig
    from user_plugin.tasks.vaswani_translation import VaswaniTranslationConfig

    chooser = argparse.ArgumentParser(prog="vaswani-options", description=__doc__.split("\n")[0])
    chooser.add_argument("--arch", default="vaswani_base", choices=our_architectures(),
                         metavar="ARCH",
                         help="the architecture whose defaults to show")
    arch = chooser.parse_args(argv).arch
    parser = argparse.ArgumentParser(
        prog="fairseq-train --user-dir user_plugin",
        description=__doc__.splitlines()[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        add_help=False,
        usage=argparse.SUPPRESS,
    )
    sections = (
        (f"model vaswani_transformer, defaults of --arch {arch}", VaswaniTransformerConfig),
        ("criterion vaswani_label_smoothed_cross_entropy", LabelSmoothedCrossEntropyConfig),
        ("lr scheduler vaswani_inverse_sqrt", InverseSqrtWarmupConfig),
        ("optimizer vaswani_adam", MultiTensorAdamConfig),
        ("task vaswani_translation (plus fairseq's translation options)",
         VaswaniTranslationConfig),
    )
    for title, config in sections:
        gen_parser_from_dataclass(parser.add_argument_group(title), config())
    model_options = {f.name for f in dataclasses.fields(VaswaniTransformerConfig)}
    parser.set_defaults(**{name: value for name, value in architecture_defaults(arch).items()
                           if name in model_options})
    parser.print_help()
    return 0


def cli_main() -> int:
    """The ``vaswani-options`` command."""
    return main()


if __name__ == "__main__":
    sys.exit(cli_main())
