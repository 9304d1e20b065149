/* A whole GET_BATCH reply sent from read-only mappings of extents in one call (the C
 * half of ExtentMaps.send_batch in dlfs/server/read/mapped_sends.py; the protocol is
 * dlfs/proto/datapath.md).
 *
 * Why: a reply from mappings costs the kernel one copy per byte, and the worker's
 * Python around it (some 360 calls per request: the ids checked, the reply planned
 * window by window, the iovecs built, the sends looped) ran after each 28 MB copy had
 * emptied the CPU's caches, and was a large share of the daemon's CPU per GB (the
 * figures: docs/DESIGN.md, "The C send of a whole reply").  This does the
 * common case (every sample's pages cached at its extent's last scan) in one call
 * that holds the interpreter lock only while it reads the arrays; everything else
 * (a bad id, a sample another member stores, a page not known cached, a reply over
 * the limits, hints) is left to the Python path, which stays the reference and the
 * fallback (`DLFS_NATIVE=0`, or no compiler at install).
 *
 * send_batch(fd, ids, extent, offset, length, crc, table, generation, flags,
 *            window_bytes, large_ok, pieces_min, large_piece_bytes, payload_max,
 *            page_bytes, stall_s, bytes_per_s_min, before)
 *   fd: the connected socket (its blocking mode is left as it was);
 *   ids: int64 sample ids, in request order;
 *   extent (uint32), offset, length (uint64), crc (uint32): the dataset's columns;
 *   table: uint64 rows by extent number, TABLE_COLUMNS each: the mapping's address
 *     (0: not mapped), its bytes, the address of its last scan's prefix sums (int32,
 *     one per page plus one; 0: none), how many prefix sums that is (a sample whose
 *     pages lie past them is not sent from here), whether that scan found every page
 *     cached, and a mark this call sets on each extent it sends from (the background
 *     thread reads and clears it: the mapping's last use, its next scan); 8-byte
 *     aligned (numpy allocates it);
 *   generation, flags: the BATCH frame's;
 *   window_bytes: the payload of one DATA frame at most;
 *   large_ok: samples averaging large_piece_bytes or more may go (else only smaller);
 *   pieces_min: fewer samples than this are left to the Python path;
 *   payload_max: a larger reply is left to the Python path (which refuses it);
 *   page_bytes: the page size the scans count in;
 *   stall_s: the most one wait for the client may take;
 *   bytes_per_s_min: the reply's deadline is stall_s plus its payload at this rate;
 *   before(payload): called once the reply will go this way, before any byte is sent.
 * Returns the payload bytes sent, or NOT_SENT with nothing sent.
 * Raises PageUnreadable(piece) when a page could not be read (EFAULT: a file cut
 * short underneath, a failing device) after completing, with zeros, the DATA frame
 * the send stopped in; `piece` counts the pieces of the reply (each sample cut at the
 * windows' ends, empty ones left out) up to the one the send stopped at.  Raises
 * TimeoutError (the client took nothing for stall_s, or the deadline passed), OSError.
 * The id and column buffers may start at any byte (the ids are a view of the request
 * frame, right after its dataset name): they are read with memcpy, never through a
 * cast pointer, whose unaligned load would be undefined behaviour.
 * The frame layout is exported (KIND_BATCH ... NO_EXTENT) so that a test holds it to
 * dlfs/formats/datapath_frames.py.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the reply's frames are written in place, little-endian; build without this"
#endif

enum { KIND_BATCH = 66, KIND_DATA = 67, FRAME_BYTES = 8, BATCH_FIXED_BYTES = 24 };
enum { T_BASE = 0, T_SIZE = 1, T_RESIDENT = 2, T_RESIDENT_ENTRIES = 3, T_WHOLE = 4, T_USED = 5,
       TABLE_COLUMNS = 6 };
#define NO_EXTENT 0xFFFFFFFFu
#define NOT_SENT (-1)
#define SEND_IOV_MAX 1024 /* the kernel's UIO_MAXIOV */
/* The longest one SO_SNDTIMEO wait is set to (a day): a larger stall_s, or a deadline
 * far off, is waited for in turns of this, never converted past a long's range. */
#define WAIT_TURN_S 86400.0

static PyObject *page_unreadable;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts); /* time.monotonic()'s clock */
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Item i of a buffer that may start at any byte (signed items: cast the result). */
static inline uint64_t load_u64(const uint8_t *at, size_t i) {
    uint64_t value;
    memcpy(&value, at + 8 * i, 8);
    return value;
}

static inline uint32_t load_u32(const uint8_t *at, size_t i) {
    uint32_t value;
    memcpy(&value, at + 4 * i, 4);
    return value;
}

static void put_frame(uint8_t *at, uint8_t kind, uint32_t body) {
    at[0] = kind;
    at[1] = 0;
    at[2] = at[3] = 0;
    memcpy(at + 4, &body, 4);
}

/* A buffer of `itemsize`-byte items whose format ends in one of `kinds`. */
static int take(PyObject *obj, Py_buffer *view, Py_ssize_t itemsize, const char *kinds,
                int writable, const char *name) {
    int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(obj, view, flags) < 0)
        return -1;
    const char *format = view->format ? view->format : "B";
    char kind = format[strlen(format) - 1];
    if (view->itemsize != itemsize || !strchr(kinds, kind)) {
        PyErr_Format(PyExc_TypeError, "send_batch: %s must hold %zd-byte items of kind %s",
                     name, itemsize, kinds);
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

/* What a send loop ended with. */
enum { SENT_ALL, SENT_FAULT, SENT_STALLED, SENT_LATE, SENT_ERROR };

/* Send every byte of iov[0..count): the first sendmsg does not wait (a reply the
 * socket takes whole costs that one call); then the socket blocks, each call bounded
 * by SO_SNDTIMEO (what is left of the stall time since the client last took bytes, or
 * before `deadline`, at most WAIT_TURN_S), so the kernel waits for room itself instead
 * of a poll per wakeup.  `iov` is advanced; `sent` counts the bytes that went out;
 * `error` holds errno for SENT_ERROR.  Runs without the interpreter lock.  `blocking`
 * is in/out: whether the socket was made blocking. */
static int send_iov(int fd, struct iovec *iov, size_t count, double stall_s, double deadline,
                    size_t *sent, int *blocking, int *error) {
    size_t first = 0;
    double taken_at = now_s(); /* when the client last took bytes (or this began) */
    while (first < count) {
        if (iov[first].iov_len == 0) {
            first++;
            continue;
        }
        struct msghdr message;
        memset(&message, 0, sizeof message);
        message.msg_iov = iov + first;
        message.msg_iovlen = count - first < SEND_IOV_MAX ? count - first : SEND_IOV_MAX;
        ssize_t n;
        if (*blocking) {
            double now = now_s();
            double left = deadline - now, wait = stall_s - (now - taken_at);
            if (left <= 0)
                return SENT_LATE;
            if (wait <= 0)
                return SENT_STALLED;
            if (left < wait)
                wait = left;
            if (wait > WAIT_TURN_S) /* a later turn waits for the rest */
                wait = WAIT_TURN_S;
            long micros = (long)(wait * 1e6);
            struct timeval tv = {micros / 1000000, micros % 1000000};
            if (tv.tv_sec == 0 && tv.tv_usec == 0)
                tv.tv_usec = 1;
            if (setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv) < 0) {
                *error = errno;
                return SENT_ERROR;
            }
            n = sendmsg(fd, &message, MSG_NOSIGNAL);
        } else {
            n = sendmsg(fd, &message, MSG_NOSIGNAL | MSG_DONTWAIT);
        }
        if (n < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EFAULT)
                return SENT_FAULT;
            if (errno != EAGAIN && errno != EWOULDBLOCK) {
                *error = errno;
                return SENT_ERROR;
            }
            if (*blocking) /* SO_SNDTIMEO ran out with nothing taken: late, stalled, or */
                continue;  /* a turn of a longer wait ended */
            n = 0;
        }
        if (n > 0)
            taken_at = now_s();
        *sent += (size_t)n;
        size_t left = (size_t)n;
        while (first < count && left >= iov[first].iov_len) {
            left -= iov[first].iov_len;
            first++;
        }
        if (first < count) {
            iov[first].iov_base = (uint8_t *)iov[first].iov_base + left;
            iov[first].iov_len -= left;
            if (!*blocking) {
                int mode = fcntl(fd, F_GETFL);
                if (mode < 0 || fcntl(fd, F_SETFL, mode & ~O_NONBLOCK) < 0) {
                    *error = errno;
                    return SENT_ERROR;
                }
                *blocking = mode & O_NONBLOCK ? 2 : 1; /* 2: O_NONBLOCK to put back */
            }
        }
    }
    return SENT_ALL;
}

/* The socket as it was found: non-blocking again if it was, no SO_SNDTIMEO. */
static void restore(int fd, int blocking) {
    if (!blocking)
        return;
    struct timeval zero = {0, 0};
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &zero, sizeof zero);
    if (blocking == 2) {
        int mode = fcntl(fd, F_GETFL);
        if (mode >= 0)
            fcntl(fd, F_SETFL, mode | O_NONBLOCK);
    }
}

static const uint8_t zeros[65536];

/* After a fault at byte `sent`: the rest of the frame it stopped in, a head's own
 * bytes as they are and the pieces' as zeros (the client's CRC32C checks never pass
 * them), so the next frame the client reads is whole.  `length[i]` is iovec i's
 * length as built, `head[i]` its head bytes or NULL for a piece.  Returns the iovec
 * the send stopped in, or -1 with *status set when the completion could not go out. */
static Py_ssize_t complete_frame(int fd, const size_t *length, uint8_t *const *head,
                                 size_t count, size_t sent, double stall_s, double deadline,
                                 int *blocking, int *status, int *error) {
    size_t entry = 0, entry_start = 0;
    while (entry < count && entry_start + length[entry] <= sent) {
        entry_start += length[entry];
        entry++;
    }
    if (entry == count) /* cannot be: a fault means bytes were left */
        entry = count - 1, entry_start -= length[entry];
    size_t frame_end = entry_start + length[entry];
    for (size_t k = entry + 1; k < count && !head[k]; k++)
        frame_end += length[k];
    size_t done = sent;
    if (head[entry]) { /* stopped inside a head: its own bytes first */
        size_t skip = sent - entry_start;
        struct iovec rest = {head[entry] + skip, length[entry] - skip};
        size_t out = 0;
        *status = send_iov(fd, &rest, 1, stall_s, deadline, &out, blocking, error);
        if (*status != SENT_ALL)
            return -1;
        done = entry_start + length[entry];
    }
    while (done < frame_end) {
        size_t step = frame_end - done < sizeof zeros ? frame_end - done : sizeof zeros;
        struct iovec pad = {(void *)zeros, step};
        size_t out = 0;
        *status = send_iov(fd, &pad, 1, stall_s, deadline, &out, blocking, error);
        if (*status != SENT_ALL)
            return -1;
        done += step;
    }
    return (Py_ssize_t)entry;
}

static PyObject *raise_for(int status, int error) {
    if (status == SENT_STALLED)
        PyErr_SetString(PyExc_TimeoutError, "the client stopped reading the reply");
    else if (status == SENT_LATE)
        PyErr_SetString(PyExc_TimeoutError, "the reply's deadline passed");
    else {
        errno = error;
        PyErr_SetFromErrno(PyExc_OSError);
    }
    return NULL;
}

static PyObject *send_batch(PyObject *self, PyObject *args) {
    (void)self;
    int fd, large_ok;
    PyObject *objs[6], *before;
    unsigned long long generation, payload_max;
    unsigned int flags;
    Py_ssize_t window_bytes, pieces_min, large_piece_bytes, page_bytes;
    double stall_s, bytes_per_s_min;
    if (!PyArg_ParseTuple(args, "iOOOOOOKInpnnKnddO:send_batch", &fd, &objs[0], &objs[1],
                          &objs[2], &objs[3], &objs[4], &objs[5], &generation,
                          &flags, &window_bytes, &large_ok, &pieces_min, &large_piece_bytes,
                          &payload_max, &page_bytes, &stall_s, &bytes_per_s_min, &before))
        return NULL;
    if (window_bytes <= 0 || page_bytes <= 0 || window_bytes > UINT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "send_batch: window_bytes and page_bytes must be "
                        "positive, a window at most 4 GiB");
        return NULL;
    }
    static const struct {
        Py_ssize_t itemsize;
        const char *kinds;
        int writable;
        const char *name;
    } wanted[6] = {{8, "ql", 0, "ids"},    {4, "I", 0, "extent"}, {8, "QL", 0, "offset"},
                   {8, "QL", 0, "length"}, {4, "I", 0, "crc"},    {8, "QL", 1, "table"}};
    Py_buffer views[6];
    int held = 0;
    PyObject *result = NULL;
    uint8_t *heads = NULL;
    struct iovec *iov = NULL;
    size_t *length_of = NULL;
    uint8_t **head_of = NULL;
    for (; held < 6; held++)
        if (take(objs[held], &views[held], wanted[held].itemsize, wanted[held].kinds,
                 wanted[held].writable, wanted[held].name) < 0)
            goto done;
    const uint8_t *ids = views[0].buf, *extent = views[1].buf, *offset = views[2].buf,
                  *length = views[3].buf, *crc = views[4].buf;
    uint64_t *table = views[5].buf;
    if ((uintptr_t)table % _Alignof(uint64_t)) {
        PyErr_SetString(PyExc_ValueError, "send_batch: the table must be 8-byte aligned");
        goto done;
    }
    size_t count = (size_t)(views[0].len / 8), samples = (size_t)(views[1].len / 4);
    size_t rows = (size_t)(views[5].len / 8 / TABLE_COLUMNS);
    if ((size_t)(views[2].len / 8) != samples || (size_t)(views[3].len / 8) != samples ||
        (size_t)(views[4].len / 4) != samples) {
        PyErr_SetString(PyExc_ValueError, "send_batch: the dataset's columns differ in length");
        goto done;
    }
    if (count == 0 || count < (size_t)pieces_min || count > UINT32_MAX) {
        result = PyLong_FromLong(NOT_SENT);
        goto done;
    }
    /* Every sample: a valid id, stored here, inside a mapped extent whose pages the
     * last scan found cached.  Nothing is sent unless all are. */
    uint64_t payload = 0;
    size_t pieces = 0;
    for (size_t i = 0; i < count; i++) {
        int64_t id = (int64_t)load_u64(ids, i);
        if (id < 0 || (uint64_t)id >= samples)
            goto not_sent;
        uint32_t extent_no = load_u32(extent, (size_t)id);
        if (extent_no == NO_EXTENT || extent_no >= rows)
            goto not_sent;
        uint64_t *row = table + (size_t)extent_no * TABLE_COLUMNS;
        uint64_t start = load_u64(offset, (size_t)id), size = load_u64(length, (size_t)id);
        if (!row[T_BASE] || size > row[T_SIZE] || start > row[T_SIZE] - size)
            goto not_sent;
        if (size && !row[T_WHOLE]) {
            /* The scan's prefix sums: entry k counts the cached pages before page k. */
            const uint8_t *resident = (const uint8_t *)(uintptr_t)row[T_RESIDENT];
            uint64_t first = start / (uint64_t)page_bytes;
            uint64_t last = (start + size - 1) / (uint64_t)page_bytes;
            if (!resident || last + 1 >= row[T_RESIDENT_ENTRIES] ||
                (uint64_t)((int32_t)load_u32(resident, (size_t)last + 1) -
                           (int32_t)load_u32(resident, (size_t)first)) != last - first + 1)
                goto not_sent;
        }
        row[T_USED] = 1;
        payload += size;
        if (payload > payload_max)
            goto not_sent;
        /* A sample is cut where windows end: ceil(size / window) parts, one more
         * where it does not start at a window's start. */
        pieces += size ? (size_t)((size - 1) / (uint64_t)window_bytes) + 2 : 0;
    }
    if (payload == 0 || (!large_ok && payload >= (uint64_t)count * (uint64_t)large_piece_bytes))
        goto not_sent;

    /* The heads: the BATCH frame (fixed part, lengths, CRC32Cs) and right after it
     * each window's DATA frame header, the first one sent with the BATCH frame in one
     * iovec; an iovec per piece between the heads. */
    size_t windows = (size_t)((payload + (uint64_t)window_bytes - 1) / (uint64_t)window_bytes);
    size_t batch_bytes = FRAME_BYTES + BATCH_FIXED_BYTES + 12 * count;
    size_t entries = pieces + windows;
    heads = malloc(batch_bytes + FRAME_BYTES * windows);
    iov = malloc(entries * sizeof *iov);
    length_of = malloc(entries * sizeof *length_of);
    head_of = malloc(entries * sizeof *head_of);
    if (!heads || !iov || !length_of || !head_of) {
        PyErr_NoMemory();
        goto done;
    }
    uint8_t *at = heads;
    put_frame(at, KIND_BATCH, (uint32_t)(batch_bytes - FRAME_BYTES));
    uint32_t samples32 = (uint32_t)count;
    memcpy(at + 8, &generation, 8);
    memcpy(at + 16, &payload, 8);
    memcpy(at + 24, &samples32, 4);
    memcpy(at + 28, &flags, 4);
    uint8_t *lengths_at = at + FRAME_BYTES + BATCH_FIXED_BYTES;
    uint8_t *crcs_at = lengths_at + 8 * count;
    for (size_t i = 0; i < count; i++) {
        size_t id = (size_t)load_u64(ids, i);
        memcpy(lengths_at + 8 * i, length + 8 * id, 8);
        memcpy(crcs_at + 4 * i, crc + 4 * id, 4);
    }
    uint8_t *data_heads = heads + batch_bytes;
    size_t entry = 0, window = 0;
    uint64_t window_left = 0;
    for (size_t i = 0; i < count; i++) {
        size_t id = (size_t)load_u64(ids, i);
        const uint64_t *row = table + (size_t)load_u32(extent, id) * TABLE_COLUMNS;
        uint8_t *from = (uint8_t *)(uintptr_t)(row[T_BASE] + load_u64(offset, id));
        uint64_t size = load_u64(length, id);
        while (size) {
            /* The entries below: a window's head where one begins, then a piece.
             * `entries` and `windows` counted them from the same lengths, so this
             * fails only if that count is wrong, and then before writing past them. */
            int begins = window_left == 0;
            if (entry + (size_t)begins + 1 > entries || (begins && window >= windows)) {
                PyErr_SetString(PyExc_SystemError, "send_batch: more pieces than counted");
                goto done;
            }
            if (begins) { /* a window begins: its DATA frame's header */
                uint64_t body = payload - (uint64_t)window * (uint64_t)window_bytes;
                if (body > (uint64_t)window_bytes)
                    body = (uint64_t)window_bytes;
                uint8_t *head = data_heads + FRAME_BYTES * window;
                put_frame(head, KIND_DATA, (uint32_t)body);
                if (window == 0) { /* one iovec with the BATCH frame */
                    iov[entry].iov_base = heads;
                    length_of[entry] = batch_bytes + FRAME_BYTES;
                } else {
                    iov[entry].iov_base = head;
                    length_of[entry] = FRAME_BYTES;
                }
                head_of[entry] = iov[entry].iov_base;
                iov[entry].iov_len = length_of[entry];
                entry++;
                window++;
                window_left = body;
            }
            uint64_t part = size < window_left ? size : window_left;
            iov[entry].iov_base = from;
            iov[entry].iov_len = length_of[entry] = (size_t)part;
            head_of[entry] = NULL;
            entry++;
            from += part;
            size -= part;
            window_left -= part;
        }
    }
    PyObject *called = PyObject_CallFunction(before, "K", (unsigned long long)payload);
    if (!called)
        goto done;
    Py_DECREF(called);

    double deadline = now_s() + stall_s + (double)payload / bytes_per_s_min;
    size_t sent = 0;
    int blocking = 0, error = 0, status;
    Py_ssize_t stopped = -1;
    Py_BEGIN_ALLOW_THREADS
    status = send_iov(fd, iov, entry, stall_s, deadline, &sent, &blocking, &error);
    if (status == SENT_FAULT)
        stopped = complete_frame(fd, length_of, head_of, entry, sent, stall_s, deadline,
                                 &blocking, &status, &error);
    restore(fd, blocking);
    Py_END_ALLOW_THREADS
    if (status == SENT_ALL && stopped < 0) {
        result = PyLong_FromUnsignedLongLong(payload);
    } else if (status == SENT_ALL) { /* the frame completed after a fault */
        Py_ssize_t heads_before = 0;
        for (Py_ssize_t k = 0; k < stopped; k++)
            heads_before += head_of[k] != NULL;
        PyObject *piece = PyLong_FromSsize_t(stopped - heads_before);
        if (piece) {
            PyErr_SetObject(page_unreadable, piece);
            Py_DECREF(piece);
        }
    } else {
        raise_for(status, error);
    }
    goto done;
not_sent:
    result = PyLong_FromLong(NOT_SENT);
done:
    free(heads);
    free(iov);
    free(length_of);
    free(head_of);
    for (int k = 0; k < held; k++)
        PyBuffer_Release(&views[k]);
    return result;
}

static PyMethodDef methods[] = {
    {"send_batch", send_batch, METH_VARARGS,
     "Send a whole GET_BATCH reply from mappings of extents (see the module's source)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "native_send",
    "A whole GET_BATCH reply sent from read-only mappings of extents in one call.", -1,
    methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit_native_send(void) {
    PyObject *m = PyModule_Create(&module);
    if (!m)
        return NULL;
    page_unreadable = PyErr_NewExceptionWithDoc(
        "dlfs.server.read.native_send.PageUnreadable",
        "A page under a mapping could not be read; args[0]: the piece the send stopped "
        "at (its frame was completed with zeros).", NULL, NULL);
    if (!page_unreadable || PyModule_AddObjectRef(m, "PageUnreadable", page_unreadable) < 0 ||
        PyModule_AddIntConstant(m, "NOT_SENT", NOT_SENT) < 0 ||
        PyModule_AddIntConstant(m, "KIND_BATCH", KIND_BATCH) < 0 ||
        PyModule_AddIntConstant(m, "KIND_DATA", KIND_DATA) < 0 ||
        PyModule_AddIntConstant(m, "FRAME_BYTES", FRAME_BYTES) < 0 ||
        PyModule_AddIntConstant(m, "BATCH_FIXED_BYTES", BATCH_FIXED_BYTES) < 0 ||
        PyModule_AddIntConstant(m, "TABLE_COLUMNS", TABLE_COLUMNS) < 0 ||
        PyModule_AddIntConstant(m, "T_BASE", T_BASE) < 0 ||
        PyModule_AddIntConstant(m, "T_SIZE", T_SIZE) < 0 ||
        PyModule_AddIntConstant(m, "T_RESIDENT", T_RESIDENT) < 0 ||
        PyModule_AddIntConstant(m, "T_RESIDENT_ENTRIES", T_RESIDENT_ENTRIES) < 0 ||
        PyModule_AddIntConstant(m, "T_WHOLE", T_WHOLE) < 0 ||
        PyModule_AddIntConstant(m, "T_USED", T_USED) < 0 ||
        PyModule_AddObject(m, "NO_EXTENT", PyLong_FromUnsignedLong(NO_EXTENT)) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
