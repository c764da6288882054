from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class BlobInfo(_message.Message):
    __slots__ = ("key", "size", "checksum")
    KEY_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    CHECKSUM_FIELD_NUMBER: _ClassVar[int]
    key: str
    size: int
    checksum: bytes
    def __init__(self, key: _Optional[str] = ..., size: _Optional[int] = ..., checksum: _Optional[bytes] = ...) -> None: ...

class Transfer(_message.Message):
    __slots__ = ("info", "chunk")
    INFO_FIELD_NUMBER: _ClassVar[int]
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    info: BlobInfo
    chunk: bytes
    def __init__(self, info: _Optional[_Union[BlobInfo, _Mapping]] = ..., chunk: _Optional[bytes] = ...) -> None: ...

class GetRequest(_message.Message):
    __slots__ = ("key",)
    KEY_FIELD_NUMBER: _ClassVar[int]
    key: str
    def __init__(self, key: _Optional[str] = ...) -> None: ...

class PutResponse(_message.Message):
    __slots__ = ("stored", "committed_size")
    STORED_FIELD_NUMBER: _ClassVar[int]
    COMMITTED_SIZE_FIELD_NUMBER: _ClassVar[int]
    stored: bool
    committed_size: int
    def __init__(self, stored: _Optional[bool] = ..., committed_size: _Optional[int] = ...) -> None: ...

class FindMissingRequest(_message.Message):
    __slots__ = ("keys",)
    KEYS_FIELD_NUMBER: _ClassVar[int]
    keys: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, keys: _Optional[_Iterable[str]] = ...) -> None: ...

class FindMissingResponse(_message.Message):
    __slots__ = ("missing",)
    MISSING_FIELD_NUMBER: _ClassVar[int]
    missing: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, missing: _Optional[_Iterable[str]] = ...) -> None: ...

class LeaseRequest(_message.Message):
    __slots__ = ("key", "wait_seconds", "hold_seconds")
    KEY_FIELD_NUMBER: _ClassVar[int]
    WAIT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    HOLD_SECONDS_FIELD_NUMBER: _ClassVar[int]
    key: str
    wait_seconds: float
    hold_seconds: float
    def __init__(self, key: _Optional[str] = ..., wait_seconds: _Optional[float] = ..., hold_seconds: _Optional[float] = ...) -> None: ...

class LeaseGranted(_message.Message):
    __slots__ = ("lease_id", "expires_in_seconds")
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_IN_SECONDS_FIELD_NUMBER: _ClassVar[int]
    lease_id: str
    expires_in_seconds: float
    def __init__(self, lease_id: _Optional[str] = ..., expires_in_seconds: _Optional[float] = ...) -> None: ...

class LeaseWaiting(_message.Message):
    __slots__ = ("waiters",)
    WAITERS_FIELD_NUMBER: _ClassVar[int]
    waiters: int
    def __init__(self, waiters: _Optional[int] = ...) -> None: ...

class LeaseEvent(_message.Message):
    __slots__ = ("granted", "waiting", "info", "chunk")
    GRANTED_FIELD_NUMBER: _ClassVar[int]
    WAITING_FIELD_NUMBER: _ClassVar[int]
    INFO_FIELD_NUMBER: _ClassVar[int]
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    granted: LeaseGranted
    waiting: LeaseWaiting
    info: BlobInfo
    chunk: bytes
    def __init__(self, granted: _Optional[_Union[LeaseGranted, _Mapping]] = ..., waiting: _Optional[_Union[LeaseWaiting, _Mapping]] = ..., info: _Optional[_Union[BlobInfo, _Mapping]] = ..., chunk: _Optional[bytes] = ...) -> None: ...

class ReportRequest(_message.Message):
    __slots__ = ("key", "checksum", "reason")
    KEY_FIELD_NUMBER: _ClassVar[int]
    CHECKSUM_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    key: str
    checksum: bytes
    reason: str
    def __init__(self, key: _Optional[str] = ..., checksum: _Optional[bytes] = ..., reason: _Optional[str] = ...) -> None: ...

class ReportResponse(_message.Message):
    __slots__ = ("dropped",)
    DROPPED_FIELD_NUMBER: _ClassVar[int]
    dropped: bool
    def __init__(self, dropped: _Optional[bool] = ...) -> None: ...

class StatsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class StatsResponse(_message.Message):
    __slots__ = ("entries", "bytes", "max_bytes", "uptime_seconds", "server_version", "upstream", "counters", "active_leases", "waiting_callers")
    class CountersEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    MAX_BYTES_FIELD_NUMBER: _ClassVar[int]
    UPTIME_SECONDS_FIELD_NUMBER: _ClassVar[int]
    SERVER_VERSION_FIELD_NUMBER: _ClassVar[int]
    UPSTREAM_FIELD_NUMBER: _ClassVar[int]
    COUNTERS_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_LEASES_FIELD_NUMBER: _ClassVar[int]
    WAITING_CALLERS_FIELD_NUMBER: _ClassVar[int]
    entries: int
    bytes: int
    max_bytes: int
    uptime_seconds: float
    server_version: str
    upstream: str
    counters: _containers.ScalarMap[str, float]
    active_leases: int
    waiting_callers: int
    def __init__(self, entries: _Optional[int] = ..., bytes: _Optional[int] = ..., max_bytes: _Optional[int] = ..., uptime_seconds: _Optional[float] = ..., server_version: _Optional[str] = ..., upstream: _Optional[str] = ..., counters: _Optional[_Mapping[str, float]] = ..., active_leases: _Optional[int] = ..., waiting_callers: _Optional[int] = ...) -> None: ...
