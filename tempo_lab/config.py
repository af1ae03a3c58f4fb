"""Process-wide settings (``tl.config``)."""
from dataclasses import dataclass


@dataclass
class Config:
    progress: bool = True  # show tqdm progress bars for long work


config = Config()
