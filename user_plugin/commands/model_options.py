"""Print the options of the plugin's model, criterion, scheduler, optimizer and task with help and
defaults.

``fairseq-train --help`` prints before fairseq adds an architecture's options, so this lists
what ``--arch vaswani_*``, ``--criterion vaswani_label_smoothed_cross_entropy``,
``--lr-scheduler vaswani_inverse_sqrt``, ``--optimizer vaswani_adam`` and ``--task
vaswani_translation`` accept.
"""

import argparse


def main() -> None:
    from fairseq.dataclass.utils import gen_parser_from_dataclass

    import user_plugin.registration  # noqa: F401  (registers everything)
    from user_plugin.criterions.label_smoothed_cross_entropy import (
        LabelSmoothedCrossEntropyConfig,
    )
    from user_plugin.lr_schedulers.inverse_sqrt_warmup import InverseSqrtWarmupConfig
    from user_plugin.models.transformer_config import VaswaniTransformerConfig
    from user_plugin.optimizers.multi_tensor_adam import MultiTensorAdamConfig
    from user_plugin.tasks.vaswani_translation import VaswaniTranslationConfig

    parser = argparse.ArgumentParser(
        prog="fairseq-train --user-dir user_plugin",
        description=__doc__.splitlines()[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        add_help=False,
        usage=argparse.SUPPRESS,
    )
    sections = (
        ("model vaswani_transformer (--arch vaswani_base|vaswani_big|...)",
         VaswaniTransformerConfig),
        ("criterion vaswani_label_smoothed_cross_entropy", LabelSmoothedCrossEntropyConfig),
        ("lr scheduler vaswani_inverse_sqrt", InverseSqrtWarmupConfig),
        ("optimizer vaswani_adam", MultiTensorAdamConfig),
        ("task vaswani_translation (plus fairseq's translation options)",
         VaswaniTranslationConfig),
    )
    for title, config in sections:
        gen_parser_from_dataclass(parser.add_argument_group(title), config())
    parser.print_help()


def cli_main() -> int:
    """The ``vaswani-options`` command."""
    main()
    return 0


if __name__ == "__main__":
    cli_main()
