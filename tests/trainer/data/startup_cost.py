"""A dataset whose items are the CPU seconds the worker process that reads them has used so far
(``time.process_time`` starts at zero in a forked process): what starting the worker cost."""

import time

from torch.utils.data import Dataset


class StartupCost(Dataset):
    def __len__(self) -> int:
        return 2

    def __getitem__(self, index: int) -> float:
        return time.process_time()
