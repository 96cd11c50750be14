"""Train a DFlash drafter for a GGUF target by self-distillation (python -m gguf_tools distill)."""


def main(argv: list[str] | None = None) -> int:
    from gguf_tools.distill.cli import main as cli_main

    return cli_main(argv)
