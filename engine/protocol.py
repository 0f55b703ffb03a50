"""The engine's wire/protocol version, reported by every member and master.

Bump it when a change makes members of different versions unable to work together; features
that need the new protocol are refused while an older member is alive (dirty-job tracking is).

``KEEL_PROTOCOL_VERSION`` makes a process announce an older version than its code: it is how a
rolling upgrade is rehearsed (and tested) without keeping old binaries around.
"""

import os

#: 2: dirty-job (recovery-degraded) tracking (engine.dirty).
CURRENT_PROTOCOL_VERSION = 2

#: The first protocol version whose members all take part in dirty-job tracking.
DIRTY_TRACKING_SINCE = 2

PROTOCOL_VERSION = int(os.environ.get("KEEL_PROTOCOL_VERSION", CURRENT_PROTOCOL_VERSION))
