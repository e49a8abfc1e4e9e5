// wire.h — the posd protocol (docs/wire_format.md): the Unix-socket handshake, the shared-memory
// session layout (request ring, reply slot, arena) and the call frame, with its strict decoder.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "pos/base/param.h"
#include "pos/base/status.h"

namespace pos::wire {

inline constexpr uint32_t kProtocolVersion = 4;  // 2: ReplySlot::async_error; 3: restore, incremental checkpoint bodies; 4: lazy-ok
inline constexpr uint32_t kHelloMagic = 0x484f5350;    // "PSOH"
inline constexpr uint32_t kWelcomeMagic = 0x574f5350;  // "PSOW"
inline constexpr uint32_t kShmMagic = 0x4d534f50;      // "POSM"
inline constexpr uint32_t kFrameMagic = 0x46534f50;    // "POSF"

// ---------------- handshake (socket) ----------------
// kReattach: a detached job's shim coming back (docs/dump_restore.md); its hello's `command` holds
// the session token, job, pid and arena as its session's, and the session memfd it maps comes with
// it (SCM_RIGHTS): a restored session takes that memory over (the job's pinned memory never moves).
enum class HelloKind : uint32_t { kSession = 1, kControl = 2, kReattach = 3 };

struct Hello {
  uint32_t magic = kHelloMagic;
  uint32_t version = kProtocolVersion;
  uint32_t kind = static_cast<uint32_t>(HelloKind::kSession);
  uint32_t pid = 0;           // informational; posd trusts SO_PEERCRED
  uint64_t arena_bytes = 0;   // wanted arena size (0: posd's default); capped by posd
  char job[64] = {};          // NUL-terminated job name
  char command[64] = {};      // kControl: "ps"
};
static_assert(sizeof(Hello) == 152);

struct Welcome {
  uint32_t magic = kWelcomeMagic;
  uint32_t version = kProtocolVersion;
  int32_t code = 0;         // pos::Code of a refusal (0: accepted)
  int32_t api_error = 0;    // the CUDA error a refused client reports
  char message[256] = {};   // why, when refused
  uint64_t client_uuid = 0;
  uint64_t shm_bytes = 0;        // size of the session memfd (sent with the reply)
  uint64_t ring_offset = 0, ring_bytes = 0;
  uint64_t reply_offset = 0;
  uint64_t arena_offset = 0, arena_bytes = 0;
  // Where posd mapped the arena: host pointers into it travel as posd's addresses (posd checks
  // each lies inside), so the worker's DMA reads the client's bytes with no copy.
  uint64_t daemon_arena_addr = 0;
  uint64_t device_base = 0;  // the client's device address range (cudaMemcpyDefault)
  uint64_t device_size = 0;
  // Every client's device range: a pointer in here that is not this client's is never host
  // memory; such calls go to posd as they are, and posd refuses them.
  uint64_t window_base = 0, window_size = 0;
  uint64_t control_bytes = 0;  // kControl: bytes of the reply text that follow
};
static_assert(sizeof(Welcome) == 376);

// ---------------- checkpoint requests (pos-cli dump) ----------------
// After a kControl hello whose command is "checkpoint", pos-cli sends one CheckpointBody, with the
// image directory's descriptor attached (SCM_RIGHTS): the image is written through the caller's own
// descriptor, so posd never opens a path on the caller's behalf. The answer is a Welcome (a refusal
// ends it), then ControlEvents: progress, and one result last.
inline constexpr uint32_t kCheckpointMagic = 0x4b435350;  // "PSCK"
inline constexpr uint32_t kEventMagic = 0x56455350;       // "PSEV"
enum class CheckpointKind : uint32_t { kSync = 0, kAsync = 1 };
struct CheckpointBody {
  uint32_t magic = kCheckpointMagic;
  uint32_t target_pid = 0;  // the job: the pid of a session's client
  uint32_t mode = 0;        // CheckpointKind
  uint32_t flags = 0;       // kCheckpointIncremental, kCheckpointLazyOk
  // Incremental: the previous image's GPU part as the new image records its parent, relative to the
  // new image's GPU part ("../../prev/gpu"); printable, NUL-terminated. Empty otherwise.
  char parent_path[488] = {};
  uint64_t since_call = 0;  // kCheckpointSince: the first call whose writes count; 0 otherwise
};
static_assert(sizeof(CheckpointBody) == 512);
// An incremental checkpoint (pos-cli dump --prev, pre-dump --prev): a second descriptor comes with
// the body, the previous image's directory, whose "gpu" part is the parent. Only buffers written
// since the parent's cut are stored; the parent must be an image posd took of this same job.
inline constexpr uint32_t kCheckpointIncremental = 1;
// `pos-cli dump --lazy-ok`: a job still loading a lazy restore is dumped at once, the buffers it has
// not loaded yet copied from the image they are loading from (else the dump waits for the load).
inline constexpr uint32_t kCheckpointLazyOk = 2;
// pos-cli migrate's peer switch (docs/migration.md): the job is detached; buffers are marked
// `in_peer` instead of stored (their bytes go to the target as device memory: "peer-export").
inline constexpr uint32_t kCheckpointPeer = 4;
// Each range of a memory file, once written, is reported (EventType::kWritten): pos-cli migrate
// sends the stop's GPU part while posd still drains it.
inline constexpr uint32_t kCheckpointWrites = 8;
// No checkpoint: the result tells what an incremental one against the previous image would store
// if taken now (bytes_stored, bytes_referenced, handles; cut_pc the next call's number). Nothing
// is cut or written. With kCheckpointIncremental only: pos-cli migrate skips a pre-copy round that
// cannot shrink the dirty set.
inline constexpr uint32_t kCheckpointEstimate = 16;
// With kCheckpointEstimate (and kCheckpointIncremental, whose image is still checked to be the
// job's): the bytes of every buffer written at or after call `since_call`, rewrites included, in
// place of those written since the previous image's cut. pos-cli migrate measures with it how much
// the job writes in the time a next round would take.
inline constexpr uint32_t kCheckpointSince = 32;
inline constexpr uint32_t kCheckpointFlags = kCheckpointIncremental | kCheckpointLazyOk | kCheckpointPeer |
                                             kCheckpointWrites | kCheckpointEstimate | kCheckpointSince;

// kWritten (kCheckpointWrites): `phase` names a memory file of the image (memory.bin, memory.K.bin),
// `done` is an offset in it and `total` a length: those bytes are written and final.
enum class EventType : uint32_t { kProgress = 1, kResult = 2, kWritten = 3 };
struct ControlEvent {
  uint32_t magic = kEventMagic;
  uint32_t type = 0;                  // EventType
  int32_t code = 0, api_error = 0;    // kResult: the outcome (pos::Code; 0 done)
  uint64_t done = 0, total = 0;       // kProgress: device bytes stored so far, of this many
  uint64_t cut_pc = 0, handles = 0;   // kResult:
  uint64_t bytes_stored = 0, bytes_referenced = 0;
  uint64_t bytes_from_image = 0;       // kResult, lazy-ok: of bytes_stored, copied from the loading image
  double stall_s = 0, total_s = 0;
  char phase[32] = {};                // kProgress: "cut", "drain"
  char message[512] = {};             // kResult: why it failed, or where the image is
};
static_assert(sizeof(ControlEvent) == 632);

// ---------------- detach and re-attach (docs/dump_restore.md) ----------------
// pos-cli → posd, after a kControl hello whose command is "detach".
inline constexpr uint32_t kDetachMagic = 0x54445350;  // "PSDT"
struct DetachBody {
  uint32_t magic = kDetachMagic;
  uint32_t target_pid = 0;
  uint32_t timeout_ms = 0;  // the job re-attaches by itself after this long without a permit
  uint32_t reserved = 0;
  char permit[512] = {};    // the file whose appearance lets the job re-attach (absolute path)
};
static_assert(sizeof(DetachBody) == 528);
// Session → the job's shim, on its session socket: detach now.
struct DetachRequest {
  uint32_t magic = kDetachMagic;
  uint32_t timeout_ms = 0;
  char token[64] = {};    // the session token the re-attach hello carries
  char permit[512] = {};
};
static_assert(sizeof(DetachRequest) == 584);
// The detach's three steps on the session socket: the shim says every frame up to `last_seq` is
// published (phase 1); the session answers once every call has finished on the device, so that no
// asynchronous copy still writes the arena (phase 1 back); the shim copies its arena, releases the
// session memory and says so (phase 2), then closes the socket.
struct DetachAck {
  uint32_t magic = kDetachMagic;
  uint32_t phase = 0;
  uint64_t last_seq = 0;
};
static_assert(sizeof(DetachAck) == 16);

// ---------------- restore (pos-cli restore) ----------------
// pos-cli → posd, after a kControl hello whose command is "restore", with the image directory's
// descriptor attached. posd starts a session process that rebuilds the GPU state from DIR/gpu and
// waits, detached, for the job's shim to re-attach with `token` (docs/dump_restore.md). The answer
// is a Welcome (a refusal ends it), ControlEvents ("load" progress, then "restored" once the GPU
// state is up), and, after pos-cli's RestoreGo, one result once the job has re-attached.
inline constexpr uint32_t kRestoreMagic = 0x53525350;  // "PSRS"
// kRestorePeer: after posd's Welcome, pos-cli sends a peer table (PeerHeader, then its PeerRanges,
// each with its descriptor): the source session's memory, from which the image's `in_peer` buffers
// are copied. Not with kRestoreLazy, unless kRestoreStaged.
// kRestoreStage (a migration target's staging, docs/migration.md "Staged at the target"): the session
// restores DIR/gpu (an earlier image of the job: a pre-copy round) eagerly, sends "restored", then a
// peer table of its memory on the connection, and ends when pos-cli hangs up; no job re-attaches to
// it and posd lists it as pid 0. Alone (no other flag).
// kRestoreStaged (with kRestorePeer): before the peer table pos-cli sends a StagedImage: the table is
// a staging session's memory, which holds image `image_id` restored; every buffer whose bytes the
// image being restored takes from that image is copied from it, the others are read from files
// (lazily with kRestoreLazy).
enum RestoreFlags : uint32_t { kRestoreLazy = 1, kRestorePeer = 2, kRestoreStage = 4, kRestoreStaged = 8 };
struct StagedImage {
  uint32_t magic = kRestoreMagic;
  uint32_t reserved = 0;
  char image_id[40] = {};  // the staged GPU image's inventory image_id (32 hex digits)
};
static_assert(sizeof(StagedImage) == 48);
struct RestoreBody {
  uint32_t magic = kRestoreMagic;
  uint32_t target_pid = 0;  // the dumped job's pid, which CRIU gives it back
  uint32_t uid = 0;         // the job's uid: root may restore anyone's, others only their own
  uint32_t flags = 0;       // RestoreFlags
  uint64_t arena_bytes = 0; // the job's session arena, as it was
  char token[64] = {};      // the image's session token (DIR/token)
  char job[64] = {};
};
static_assert(sizeof(RestoreBody) == 152);
// pos-cli → the restoring session, on the same connection: CRIU has restored the job as `pid`
// (from now on the session ends with that process); or a hang-up before it: the restore is
// abandoned and the session ends.
struct RestoreGo {
  uint32_t magic = kRestoreMagic;
  uint32_t pid = 0;
};
static_assert(sizeof(RestoreGo) == 8);

// pos-cli → posd, after a kControl hello whose command is "release": a job that left this posd
// detached and re-attached to another posd of this host (pos-cli migrate's live switch) no longer
// needs its session here; the session still detached with `token` ends and frees its device
// memory. posd answers with a Welcome (code 0: released) or a refusal naming why.
inline constexpr uint32_t kReleaseMagic = 0x4c525350;  // "PSRL"
struct ReleaseBody {
  uint32_t magic = kReleaseMagic;
  uint32_t target_pid = 0;
  char token[64] = {};  // the detach's token: only the one who detached the job knows it
};
static_assert(sizeof(ReleaseBody) == 72);

// ---------------- peer memory (pos-cli migrate's peer switch) ----------------
// pos-cli → posd, after a kControl hello whose command is "peer-export": the job detached with
// `token` (only its detacher knows it) hands out its device memory. The session process answers on
// the connection: a Welcome (a refusal ends it), then a peer table.
inline constexpr uint32_t kPeerMagic = 0x52505350;  // "PSPR"
struct PeerExportBody {
  uint32_t magic = kPeerMagic;
  uint32_t target_pid = 0;
  char token[64] = {};
};
static_assert(sizeof(PeerExportBody) == 72);
// A peer table: one header, then `count` ranges in batches of kPeerBatch (the last one shorter),
// each batch one message with one descriptor per range attached in order (SCM_RIGHTS): the memory
// that backs [addr, addr + size) in the exporting session. The same table goes from pos-cli to the
// target's restoring session (kRestorePeer).
inline constexpr uint32_t kMaxPeerRanges = 1u << 16;
inline constexpr uint32_t kPeerBatch = 64;  // under the kernel's 253 descriptors per message
struct PeerHeader {
  uint32_t magic = kPeerMagic;
  int32_t code = 0, api_error = 0;  // the export's outcome (pos::Code; 0: ranges follow)
  uint32_t count = 0;
  uint64_t bytes = 0;               // the ranges' sizes, summed
  char message[496] = {};           // why it failed
};
static_assert(sizeof(PeerHeader) == 520);
struct PeerRange {
  uint32_t magic = kPeerMagic;
  uint32_t index = 0;  // 0, 1, ... in order
  uint64_t addr = 0, size = 0;
};
static_assert(sizeof(PeerRange) == 24);

// ---------------- shared memory ----------------
// Offsets inside the session memfd. The header's fields are each written by one side only.
struct alignas(64) ShmHeader {
  uint32_t magic;
  uint32_t version;
  uint64_t ring_bytes;
  // ---- client writes ----
  alignas(64) std::atomic<uint64_t> tail;   // bytes of frames published
  std::atomic<uint32_t> client_sleeping;    // the client waits on done32 (futex)
  // ---- posd writes ----
  alignas(64) std::atomic<uint64_t> head;      // bytes of frames consumed
  std::atomic<uint64_t> done_seq;              // every frame with seq <= done_seq has been handled
  std::atomic<uint32_t> done32;                // futex word: low 32 bits of done_seq
  std::atomic<uint32_t> server_sleeping;       // posd waits on its eventfd
};
static_assert(std::atomic<uint64_t>::is_always_lock_free && std::atomic<uint32_t>::is_always_lock_free);

inline constexpr uint64_t kMaxRet = 16384;  // the largest result: a kernel's parameter layout
inline constexpr uint64_t kMaxMessage = 480;

// The reply to the latest frame that asked for one (one such frame is in flight per session).
struct ReplySlot {
  uint64_t seq;
  int32_t code, api_error;
  int32_t deferred_code, deferred_api_error;  // first failure of a posted frame since the last reply
  uint64_t ret_written;
  uint32_t message_len, deferred_message_len;
  // The worker's asynchronous error taken by posted cudaGetLastError frames since the last reply
  // (0: none). The client keeps it for its next cudaGetLastError; it is not this call's error.
  int32_t async_error;
  uint32_t reserved;
  char message[kMaxMessage];
  char deferred_message[kMaxMessage];
  std::byte ret[kMaxRet];
};

inline constexpr uint64_t kHeaderBytes = 4096;
inline constexpr uint64_t kReplyBytes = 20480;
static_assert(sizeof(ShmHeader) <= kHeaderBytes && sizeof(ReplySlot) <= kReplyBytes);
inline constexpr uint64_t kRingBytes = 1ull << 20;
inline constexpr uint64_t kArenaAlign = 4096;

struct Layout {
  uint64_t ring_offset, ring_bytes, reply_offset, arena_offset, arena_bytes, total;
};
Layout layout_for(uint64_t arena_bytes);

// ---------------- frames ----------------
enum FrameFlags : uint16_t {
  kFlagReply = 1,  // the client waits for the reply slot
  kFlagPad = 2,    // filler up to the ring's end; the next frame starts at offset 0
};
// A parameter size with this bit lives in the arena: its 8 payload bytes are the arena offset.
inline constexpr uint64_t kIndirect = 1ull << 63;
inline constexpr uint32_t kMaxParams = 16;
inline constexpr uint32_t kMaxInlineParam = 64 << 10;  // bigger parameters travel through the arena

struct FrameHeader {
  uint32_t magic;
  uint32_t total_len;  // header + sizes + padded payload; a multiple of 8
  uint32_t api_id;
  uint16_t nparams;
  uint16_t flags;
  uint64_t seq;
  uint64_t ret_cap;  // result bytes wanted (<= kMaxRet)
};
static_assert(sizeof(FrameHeader) == 32);

inline constexpr uint64_t pad8(uint64_t n) { return (n + 7) & ~uint64_t{7}; }

// Frame length for these parameter sizes (indirect ones count 8 payload bytes).
uint64_t frame_bytes(std::span<const uint64_t> sizes);

// Writes a frame at `out` (frame_bytes(...) bytes). `sizes[i]` may carry kIndirect, then
// params[i].data points at the 8-byte arena offset.
void encode_frame(std::byte* out, uint32_t api_id, uint16_t flags, uint64_t seq, uint64_t ret_cap,
                  std::span<const Param> params, std::span<const uint64_t> sizes);

struct DecodedFrame {
  FrameHeader h{};
  uint32_t nparams = 0;
  Param params[kMaxParams]{};
};

// Checks everything about a frame of at most `avail` bytes at `p` (which the peer may still be
// changing: every header field is read once). Indirect parameters are resolved against the
// arena [arena, arena + arena_bytes); any that does not lie wholly inside is an error.
Status decode_frame(const std::byte* p, uint64_t avail, const std::byte* arena, uint64_t arena_bytes,
                    DecodedFrame* out);

// Futex helpers on a shared (non-private) word.
void futex_wait(std::atomic<uint32_t>* word, uint32_t expected, int timeout_ms);
void futex_wake_all(std::atomic<uint32_t>* word);

// Copies a C string into a fixed field, NUL-terminated, truncating.
void put_cstr(char* dst, size_t cap, const std::string& s);
// The field as a string: up to the first NUL or `cap`.
std::string get_cstr(const char* src, size_t cap);

}  // namespace pos::wire
