"""What the parts of the engine add to a finished job's record.

The record (JobHistory) is written in one place, the job's terminal transition; each contributor
(the dirty-job tracker, say) is asked for its part there. A part names the record fields it fills
and the events of what it did to produce them, in that same transaction.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class HistoryPart:
    fields: dict[str, Any] = field(default_factory=dict)
    #: EngineEvents to append with the record.
    events: list[Any] = field(default_factory=list)
