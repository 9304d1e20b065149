from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class EntryKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ENTRY_KIND_UNSPECIFIED: _ClassVar[EntryKind]
    FILE: _ClassVar[EntryKind]
    DIRECTORY: _ClassVar[EntryKind]
ENTRY_KIND_UNSPECIFIED: EntryKind
FILE: EntryKind
DIRECTORY: EntryKind

class WarmRequest(_message.Message):
    __slots__ = ("dataset", "status_only")
    DATASET_FIELD_NUMBER: _ClassVar[int]
    STATUS_ONLY_FIELD_NUMBER: _ClassVar[int]
    dataset: str
    status_only: bool
    def __init__(self, dataset: _Optional[str] = ..., status_only: _Optional[bool] = ...) -> None: ...

class WarmReply(_message.Message):
    __slots__ = ("dataset", "generation", "state", "bytes_total", "bytes_warmed", "budget_bytes", "fits", "message", "bytes_resident")
    DATASET_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    BYTES_TOTAL_FIELD_NUMBER: _ClassVar[int]
    BYTES_WARMED_FIELD_NUMBER: _ClassVar[int]
    BUDGET_BYTES_FIELD_NUMBER: _ClassVar[int]
    FITS_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    BYTES_RESIDENT_FIELD_NUMBER: _ClassVar[int]
    dataset: str
    generation: int
    state: str
    bytes_total: int
    bytes_warmed: int
    budget_bytes: int
    fits: bool
    message: str
    bytes_resident: int
    def __init__(self, dataset: _Optional[str] = ..., generation: _Optional[int] = ..., state: _Optional[str] = ..., bytes_total: _Optional[int] = ..., bytes_warmed: _Optional[int] = ..., budget_bytes: _Optional[int] = ..., fits: _Optional[bool] = ..., message: _Optional[str] = ..., bytes_resident: _Optional[int] = ...) -> None: ...

class CreateSpaceRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class SpacePathRequest(_message.Message):
    __slots__ = ("space", "path", "mode", "directory", "target")
    SPACE_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    DIRECTORY_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    space: str
    path: str
    mode: int
    directory: bool
    target: str
    def __init__(self, space: _Optional[str] = ..., path: _Optional[str] = ..., mode: _Optional[int] = ..., directory: _Optional[bool] = ..., target: _Optional[str] = ...) -> None: ...

class RemoveReply(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetDataPathRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class DataPathInfo(_message.Message):
    __slots__ = ("enabled", "reason", "version", "port", "unix_socket", "instance")
    ENABLED_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    PORT_FIELD_NUMBER: _ClassVar[int]
    UNIX_SOCKET_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_FIELD_NUMBER: _ClassVar[int]
    enabled: bool
    reason: str
    version: int
    port: int
    unix_socket: str
    instance: bytes
    def __init__(self, enabled: _Optional[bool] = ..., reason: _Optional[str] = ..., version: _Optional[int] = ..., port: _Optional[int] = ..., unix_socket: _Optional[str] = ..., instance: _Optional[bytes] = ...) -> None: ...

class ListDatasetsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListDatasetsReply(_message.Message):
    __slots__ = ("datasets",)
    DATASETS_FIELD_NUMBER: _ClassVar[int]
    datasets: _containers.RepeatedCompositeFieldContainer[DatasetInfo]
    def __init__(self, datasets: _Optional[_Iterable[_Union[DatasetInfo, _Mapping]]] = ...) -> None: ...

class GetDatasetRequest(_message.Message):
    __slots__ = ("dataset",)
    DATASET_FIELD_NUMBER: _ClassVar[int]
    dataset: str
    def __init__(self, dataset: _Optional[str] = ...) -> None: ...

class DatasetInfo(_message.Message):
    __slots__ = ("name", "samples", "bytes", "sealed", "created_unix_ns", "extents", "members", "replicas", "member_index", "generation", "ingest_state", "kind")
    NAME_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    SEALED_FIELD_NUMBER: _ClassVar[int]
    CREATED_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    EXTENTS_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    MEMBER_INDEX_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    INGEST_STATE_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    name: str
    samples: int
    bytes: int
    sealed: bool
    created_unix_ns: int
    extents: int
    members: _containers.RepeatedScalarFieldContainer[str]
    replicas: int
    member_index: int
    generation: int
    ingest_state: str
    kind: str
    def __init__(self, name: _Optional[str] = ..., samples: _Optional[int] = ..., bytes: _Optional[int] = ..., sealed: _Optional[bool] = ..., created_unix_ns: _Optional[int] = ..., extents: _Optional[int] = ..., members: _Optional[_Iterable[str]] = ..., replicas: _Optional[int] = ..., member_index: _Optional[int] = ..., generation: _Optional[int] = ..., ingest_state: _Optional[str] = ..., kind: _Optional[str] = ...) -> None: ...

class Entry(_message.Message):
    __slots__ = ("name", "path", "kind", "size", "mode", "mtime_ns", "id", "crc32c", "children", "version")
    NAME_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    MTIME_NS_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    CRC32C_FIELD_NUMBER: _ClassVar[int]
    CHILDREN_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    name: str
    path: str
    kind: EntryKind
    size: int
    mode: int
    mtime_ns: int
    id: int
    crc32c: int
    children: int
    version: int
    def __init__(self, name: _Optional[str] = ..., path: _Optional[str] = ..., kind: _Optional[_Union[EntryKind, str]] = ..., size: _Optional[int] = ..., mode: _Optional[int] = ..., mtime_ns: _Optional[int] = ..., id: _Optional[int] = ..., crc32c: _Optional[int] = ..., children: _Optional[int] = ..., version: _Optional[int] = ...) -> None: ...

class StatRequest(_message.Message):
    __slots__ = ("dataset", "path", "generation")
    DATASET_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    dataset: str
    path: str
    generation: int
    def __init__(self, dataset: _Optional[str] = ..., path: _Optional[str] = ..., generation: _Optional[int] = ...) -> None: ...

class ListDirRequest(_message.Message):
    __slots__ = ("dataset", "path", "start_after", "page_size", "generation")
    DATASET_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    START_AFTER_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    dataset: str
    path: str
    start_after: str
    page_size: int
    generation: int
    def __init__(self, dataset: _Optional[str] = ..., path: _Optional[str] = ..., start_after: _Optional[str] = ..., page_size: _Optional[int] = ..., generation: _Optional[int] = ...) -> None: ...

class ListDirReply(_message.Message):
    __slots__ = ("entries", "more")
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    MORE_FIELD_NUMBER: _ClassVar[int]
    entries: _containers.RepeatedCompositeFieldContainer[Entry]
    more: bool
    def __init__(self, entries: _Optional[_Iterable[_Union[Entry, _Mapping]]] = ..., more: _Optional[bool] = ...) -> None: ...

class LookupRequest(_message.Message):
    __slots__ = ("dataset", "ids", "paths")
    DATASET_FIELD_NUMBER: _ClassVar[int]
    IDS_FIELD_NUMBER: _ClassVar[int]
    PATHS_FIELD_NUMBER: _ClassVar[int]
    dataset: str
    ids: _containers.RepeatedScalarFieldContainer[int]
    paths: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, dataset: _Optional[str] = ..., ids: _Optional[_Iterable[int]] = ..., paths: _Optional[_Iterable[str]] = ...) -> None: ...

class LookupReply(_message.Message):
    __slots__ = ("entries",)
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    entries: _containers.RepeatedCompositeFieldContainer[Entry]
    def __init__(self, entries: _Optional[_Iterable[_Union[Entry, _Mapping]]] = ...) -> None: ...

class GetBatchRequest(_message.Message):
    __slots__ = ("dataset", "ids", "paths", "skip_verify", "prefetch_ids", "generation")
    DATASET_FIELD_NUMBER: _ClassVar[int]
    IDS_FIELD_NUMBER: _ClassVar[int]
    PATHS_FIELD_NUMBER: _ClassVar[int]
    SKIP_VERIFY_FIELD_NUMBER: _ClassVar[int]
    PREFETCH_IDS_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    dataset: str
    ids: _containers.RepeatedScalarFieldContainer[int]
    paths: _containers.RepeatedScalarFieldContainer[str]
    skip_verify: bool
    prefetch_ids: _containers.RepeatedScalarFieldContainer[int]
    generation: int
    def __init__(self, dataset: _Optional[str] = ..., ids: _Optional[_Iterable[int]] = ..., paths: _Optional[_Iterable[str]] = ..., skip_verify: _Optional[bool] = ..., prefetch_ids: _Optional[_Iterable[int]] = ..., generation: _Optional[int] = ...) -> None: ...

class PrefetchRequest(_message.Message):
    __slots__ = ("dataset", "ids", "paths")
    DATASET_FIELD_NUMBER: _ClassVar[int]
    IDS_FIELD_NUMBER: _ClassVar[int]
    PATHS_FIELD_NUMBER: _ClassVar[int]
    dataset: str
    ids: _containers.RepeatedScalarFieldContainer[int]
    paths: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, dataset: _Optional[str] = ..., ids: _Optional[_Iterable[int]] = ..., paths: _Optional[_Iterable[str]] = ...) -> None: ...

class PrefetchReply(_message.Message):
    __slots__ = ("ranges", "bytes")
    RANGES_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    ranges: int
    bytes: int
    def __init__(self, ranges: _Optional[int] = ..., bytes: _Optional[int] = ...) -> None: ...

class ReadRangeRequest(_message.Message):
    __slots__ = ("dataset", "id", "path", "offset", "length", "skip_verify", "generation")
    DATASET_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    SKIP_VERIFY_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    dataset: str
    id: int
    path: str
    offset: int
    length: int
    skip_verify: bool
    generation: int
    def __init__(self, dataset: _Optional[str] = ..., id: _Optional[int] = ..., path: _Optional[str] = ..., offset: _Optional[int] = ..., length: _Optional[int] = ..., skip_verify: _Optional[bool] = ..., generation: _Optional[int] = ...) -> None: ...

class GetIndexRequest(_message.Message):
    __slots__ = ("dataset",)
    DATASET_FIELD_NUMBER: _ClassVar[int]
    dataset: str
    def __init__(self, dataset: _Optional[str] = ...) -> None: ...

class IndexChunk(_message.Message):
    __slots__ = ("dataset_id", "samples", "first_id", "extent", "offset", "length", "crc32c", "holders", "members", "replicas", "generation")
    DATASET_ID_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_FIELD_NUMBER: _ClassVar[int]
    FIRST_ID_FIELD_NUMBER: _ClassVar[int]
    EXTENT_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    CRC32C_FIELD_NUMBER: _ClassVar[int]
    HOLDERS_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    dataset_id: int
    samples: int
    first_id: int
    extent: bytes
    offset: bytes
    length: bytes
    crc32c: bytes
    holders: bytes
    members: _containers.RepeatedScalarFieldContainer[str]
    replicas: int
    generation: int
    def __init__(self, dataset_id: _Optional[int] = ..., samples: _Optional[int] = ..., first_id: _Optional[int] = ..., extent: _Optional[bytes] = ..., offset: _Optional[bytes] = ..., length: _Optional[bytes] = ..., crc32c: _Optional[bytes] = ..., holders: _Optional[bytes] = ..., members: _Optional[_Iterable[str]] = ..., replicas: _Optional[int] = ..., generation: _Optional[int] = ...) -> None: ...

class ScrubRequest(_message.Message):
    __slots__ = ("dataset",)
    DATASET_FIELD_NUMBER: _ClassVar[int]
    dataset: str
    def __init__(self, dataset: _Optional[str] = ...) -> None: ...

class ScrubProgress(_message.Message):
    __slots__ = ("samples_checked", "bytes_checked", "samples_total", "damaged", "reasons", "done")
    SAMPLES_CHECKED_FIELD_NUMBER: _ClassVar[int]
    BYTES_CHECKED_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_TOTAL_FIELD_NUMBER: _ClassVar[int]
    DAMAGED_FIELD_NUMBER: _ClassVar[int]
    REASONS_FIELD_NUMBER: _ClassVar[int]
    DONE_FIELD_NUMBER: _ClassVar[int]
    samples_checked: int
    bytes_checked: int
    samples_total: int
    damaged: _containers.RepeatedCompositeFieldContainer[Entry]
    reasons: _containers.RepeatedScalarFieldContainer[str]
    done: bool
    def __init__(self, samples_checked: _Optional[int] = ..., bytes_checked: _Optional[int] = ..., samples_total: _Optional[int] = ..., damaged: _Optional[_Iterable[_Union[Entry, _Mapping]]] = ..., reasons: _Optional[_Iterable[str]] = ..., done: _Optional[bool] = ...) -> None: ...

class StatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class StatusReply(_message.Message):
    __slots__ = ("version", "uptime_s", "data_dir", "metrics_address", "datasets", "samples", "bytes", "catalog_bytes", "ingests_running", "rpcs_in_flight", "samples_served", "bytes_served", "batches_served", "cache_hit_ranges", "cache_miss_ranges", "errors", "data_connections", "sendfile", "sendfile_bytes", "data_workers", "mapped_sends", "mapped_send_bytes", "disk_bytes", "disk_free_bytes", "space_files", "space_bytes", "space_files_max")
    class ErrorsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    VERSION_FIELD_NUMBER: _ClassVar[int]
    UPTIME_S_FIELD_NUMBER: _ClassVar[int]
    DATA_DIR_FIELD_NUMBER: _ClassVar[int]
    METRICS_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    DATASETS_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    CATALOG_BYTES_FIELD_NUMBER: _ClassVar[int]
    INGESTS_RUNNING_FIELD_NUMBER: _ClassVar[int]
    RPCS_IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_SERVED_FIELD_NUMBER: _ClassVar[int]
    BYTES_SERVED_FIELD_NUMBER: _ClassVar[int]
    BATCHES_SERVED_FIELD_NUMBER: _ClassVar[int]
    CACHE_HIT_RANGES_FIELD_NUMBER: _ClassVar[int]
    CACHE_MISS_RANGES_FIELD_NUMBER: _ClassVar[int]
    ERRORS_FIELD_NUMBER: _ClassVar[int]
    DATA_CONNECTIONS_FIELD_NUMBER: _ClassVar[int]
    SENDFILE_FIELD_NUMBER: _ClassVar[int]
    SENDFILE_BYTES_FIELD_NUMBER: _ClassVar[int]
    DATA_WORKERS_FIELD_NUMBER: _ClassVar[int]
    MAPPED_SENDS_FIELD_NUMBER: _ClassVar[int]
    MAPPED_SEND_BYTES_FIELD_NUMBER: _ClassVar[int]
    DISK_BYTES_FIELD_NUMBER: _ClassVar[int]
    DISK_FREE_BYTES_FIELD_NUMBER: _ClassVar[int]
    SPACE_FILES_FIELD_NUMBER: _ClassVar[int]
    SPACE_BYTES_FIELD_NUMBER: _ClassVar[int]
    SPACE_FILES_MAX_FIELD_NUMBER: _ClassVar[int]
    version: str
    uptime_s: float
    data_dir: str
    metrics_address: str
    datasets: int
    samples: int
    bytes: int
    catalog_bytes: int
    ingests_running: int
    rpcs_in_flight: int
    samples_served: int
    bytes_served: int
    batches_served: int
    cache_hit_ranges: int
    cache_miss_ranges: int
    errors: _containers.ScalarMap[str, int]
    data_connections: int
    sendfile: str
    sendfile_bytes: int
    data_workers: _containers.RepeatedCompositeFieldContainer[DataWorker]
    mapped_sends: str
    mapped_send_bytes: int
    disk_bytes: int
    disk_free_bytes: int
    space_files: int
    space_bytes: int
    space_files_max: int
    def __init__(self, version: _Optional[str] = ..., uptime_s: _Optional[float] = ..., data_dir: _Optional[str] = ..., metrics_address: _Optional[str] = ..., datasets: _Optional[int] = ..., samples: _Optional[int] = ..., bytes: _Optional[int] = ..., catalog_bytes: _Optional[int] = ..., ingests_running: _Optional[int] = ..., rpcs_in_flight: _Optional[int] = ..., samples_served: _Optional[int] = ..., bytes_served: _Optional[int] = ..., batches_served: _Optional[int] = ..., cache_hit_ranges: _Optional[int] = ..., cache_miss_ranges: _Optional[int] = ..., errors: _Optional[_Mapping[str, int]] = ..., data_connections: _Optional[int] = ..., sendfile: _Optional[str] = ..., sendfile_bytes: _Optional[int] = ..., data_workers: _Optional[_Iterable[_Union[DataWorker, _Mapping]]] = ..., mapped_sends: _Optional[str] = ..., mapped_send_bytes: _Optional[int] = ..., disk_bytes: _Optional[int] = ..., disk_free_bytes: _Optional[int] = ..., space_files: _Optional[int] = ..., space_bytes: _Optional[int] = ..., space_files_max: _Optional[int] = ...) -> None: ...

class DataWorker(_message.Message):
    __slots__ = ("index", "pid", "state", "connections", "requests", "bytes_served", "cpu_s", "restarts")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    CONNECTIONS_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_FIELD_NUMBER: _ClassVar[int]
    BYTES_SERVED_FIELD_NUMBER: _ClassVar[int]
    CPU_S_FIELD_NUMBER: _ClassVar[int]
    RESTARTS_FIELD_NUMBER: _ClassVar[int]
    index: int
    pid: int
    state: str
    connections: int
    requests: int
    bytes_served: int
    cpu_s: float
    restarts: int
    def __init__(self, index: _Optional[int] = ..., pid: _Optional[int] = ..., state: _Optional[str] = ..., connections: _Optional[int] = ..., requests: _Optional[int] = ..., bytes_served: _Optional[int] = ..., cpu_s: _Optional[float] = ..., restarts: _Optional[int] = ...) -> None: ...

class BatchChunk(_message.Message):
    __slots__ = ("data", "data_offset", "payload_bytes", "offsets", "lengths")
    DATA_FIELD_NUMBER: _ClassVar[int]
    DATA_OFFSET_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_BYTES_FIELD_NUMBER: _ClassVar[int]
    OFFSETS_FIELD_NUMBER: _ClassVar[int]
    LENGTHS_FIELD_NUMBER: _ClassVar[int]
    data: bytes
    data_offset: int
    payload_bytes: int
    offsets: _containers.RepeatedScalarFieldContainer[int]
    lengths: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, data: _Optional[bytes] = ..., data_offset: _Optional[int] = ..., payload_bytes: _Optional[int] = ..., offsets: _Optional[_Iterable[int]] = ..., lengths: _Optional[_Iterable[int]] = ...) -> None: ...

class IngestMessage(_message.Message):
    __slots__ = ("start", "pieces", "end")
    START_FIELD_NUMBER: _ClassVar[int]
    PIECES_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    start: IngestStart
    pieces: _containers.RepeatedCompositeFieldContainer[IngestPiece]
    end: IngestEnd
    def __init__(self, start: _Optional[_Union[IngestStart, _Mapping]] = ..., pieces: _Optional[_Iterable[_Union[IngestPiece, _Mapping]]] = ..., end: _Optional[_Union[IngestEnd, _Mapping]] = ...) -> None: ...

class IngestEnd(_message.Message):
    __slots__ = ("files", "bytes")
    FILES_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    files: int
    bytes: int
    def __init__(self, files: _Optional[int] = ..., bytes: _Optional[int] = ...) -> None: ...

class IngestStart(_message.Message):
    __slots__ = ("dataset", "replace", "members", "replicas", "member_index", "prepare_only", "generation", "resumable", "resume", "resume_from")
    DATASET_FIELD_NUMBER: _ClassVar[int]
    REPLACE_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    MEMBER_INDEX_FIELD_NUMBER: _ClassVar[int]
    PREPARE_ONLY_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    RESUMABLE_FIELD_NUMBER: _ClassVar[int]
    RESUME_FIELD_NUMBER: _ClassVar[int]
    RESUME_FROM_FIELD_NUMBER: _ClassVar[int]
    dataset: str
    replace: bool
    members: _containers.RepeatedScalarFieldContainer[str]
    replicas: int
    member_index: int
    prepare_only: bool
    generation: int
    resumable: bool
    resume: bool
    resume_from: int
    def __init__(self, dataset: _Optional[str] = ..., replace: _Optional[bool] = ..., members: _Optional[_Iterable[str]] = ..., replicas: _Optional[int] = ..., member_index: _Optional[int] = ..., prepare_only: _Optional[bool] = ..., generation: _Optional[int] = ..., resumable: _Optional[bool] = ..., resume: _Optional[bool] = ..., resume_from: _Optional[int] = ...) -> None: ...

class GetIngestProgressRequest(_message.Message):
    __slots__ = ("dataset",)
    DATASET_FIELD_NUMBER: _ClassVar[int]
    dataset: str
    def __init__(self, dataset: _Optional[str] = ...) -> None: ...

class IngestProgress(_message.Message):
    __slots__ = ("dataset", "state", "samples", "bytes", "digest", "last_path", "replace", "members", "replicas", "member_index", "generation", "parked_unix_ns", "expires_in_s")
    DATASET_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    DIGEST_FIELD_NUMBER: _ClassVar[int]
    LAST_PATH_FIELD_NUMBER: _ClassVar[int]
    REPLACE_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    MEMBER_INDEX_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    PARKED_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_IN_S_FIELD_NUMBER: _ClassVar[int]
    dataset: str
    state: str
    samples: int
    bytes: int
    digest: bytes
    last_path: str
    replace: bool
    members: _containers.RepeatedScalarFieldContainer[str]
    replicas: int
    member_index: int
    generation: int
    parked_unix_ns: int
    expires_in_s: float
    def __init__(self, dataset: _Optional[str] = ..., state: _Optional[str] = ..., samples: _Optional[int] = ..., bytes: _Optional[int] = ..., digest: _Optional[bytes] = ..., last_path: _Optional[str] = ..., replace: _Optional[bool] = ..., members: _Optional[_Iterable[str]] = ..., replicas: _Optional[int] = ..., member_index: _Optional[int] = ..., generation: _Optional[int] = ..., parked_unix_ns: _Optional[int] = ..., expires_in_s: _Optional[float] = ...) -> None: ...

class IngestPiece(_message.Message):
    __slots__ = ("path", "size", "mode", "mtime_ns", "data", "crc32c", "holders", "remote", "kept", "directory")
    PATH_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    MTIME_NS_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    CRC32C_FIELD_NUMBER: _ClassVar[int]
    HOLDERS_FIELD_NUMBER: _ClassVar[int]
    REMOTE_FIELD_NUMBER: _ClassVar[int]
    KEPT_FIELD_NUMBER: _ClassVar[int]
    DIRECTORY_FIELD_NUMBER: _ClassVar[int]
    path: str
    size: int
    mode: int
    mtime_ns: int
    data: bytes
    crc32c: int
    holders: _containers.RepeatedScalarFieldContainer[int]
    remote: bool
    kept: bool
    directory: bool
    def __init__(self, path: _Optional[str] = ..., size: _Optional[int] = ..., mode: _Optional[int] = ..., mtime_ns: _Optional[int] = ..., data: _Optional[bytes] = ..., crc32c: _Optional[int] = ..., holders: _Optional[_Iterable[int]] = ..., remote: _Optional[bool] = ..., kept: _Optional[bool] = ..., directory: _Optional[bool] = ...) -> None: ...

class DeleteDatasetRequest(_message.Message):
    __slots__ = ("dataset",)
    DATASET_FIELD_NUMBER: _ClassVar[int]
    dataset: str
    def __init__(self, dataset: _Optional[str] = ...) -> None: ...
