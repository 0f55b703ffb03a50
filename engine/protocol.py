"""The engine's wire/protocol version, reported by every member and master.

Bump it when a change makes members of different versions unable to work together; features
that need the new protocol are refused while an older member is alive (dirty-job tracking does).
"""

PROTOCOL_VERSION = 1
