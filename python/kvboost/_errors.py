"""Exceptions raised by kvboost. Every one is a :class:`Error`; the message is the engine's."""


class Error(Exception):
    """Base class of every kvboost error."""


class ModelNotFoundError(Error, FileNotFoundError):
    """The model argument names no directory, .gguf file or cached Hugging Face snapshot.

    The message names the id, the cache folder searched and the download command."""


class InvalidRequestError(Error, ValueError):
    """Bad input: an empty or too long prompt, out-of-range sampling values, bad options."""


class ChatTemplateError(Error):
    """The model has no chat template, or it cannot render these messages."""


class EngineError(Error, RuntimeError):
    """The engine failed (a corrupt weight file, a failed load, an error during generation)."""
