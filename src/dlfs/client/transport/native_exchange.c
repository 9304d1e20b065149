/* One GET_BATCH exchange of the data path's client in a single call (the C half of
 * dlfs/client/transport/datapath_conn.py; the protocol is dlfs/proto/datapath.md).
 *
 * Why: with 4 KB samples the client's Python per batch (some sixty calls between the
 * request and the last sample checked: each frame read, the deadline kept, the
 * reply parsed, a view cut per sample) cost as much CPU as the kernel's copy of the
 * reply, and on a host whose cores the daemon shares that decides the batch rate
 * (docs/DESIGN.md, "Client and transports").  This does the common case (a whole
 * BATCH reply of samples) in one call that holds the interpreter lock only to cut
 * the views and to call the CRC32C function, after the reply's last byte; everything
 * else (errors the daemon sends, replies it does not take, ranges) goes back to the
 * Python code, which stays the reference and the fallback (`DLFS_NATIVE=0`, or no
 * compiler at install).
 *
 * get_batch(fd, request, deadline, wait_s, header_bytes_max, take, crc32c, readonly)
 *   fd: the connected socket (left in the blocking mode it had);
 *   request: list of at most REQUEST_BUFFERS_MAX bytes-like objects, sent in order;
 *   deadline: time.monotonic() by which the whole exchange must be done;
 *   wait_s: the most any one wait may take (the socket's timeout);
 *   header_bytes_max: the longest BATCH frame body taken here;
 *   take(n): the writable buffer of n bytes the payload is received into;
 *   crc32c: called on each sample's view to check it against the reply (None: not);
 *   readonly: the views are read-only.
 * Returns one of (what stopped it, then what the Python side needs to go on):
 *   (SEND_FAILED, errno)              the request did not go out (errno 0: a wait ran
 *                                     out); nothing was received
 *   (NOT_BATCH, kind, length)         a frame other than a BATCH that fits came first;
 *                                     its body is still to be read
 *   (BATCH_LEFT, body)                a BATCH frame this does not take (blocks, or
 *                                     inconsistent): the Python side parses it
 *   (NOT_DATA, kind, length)          a frame other than DATA within the payload came;
 *                                     its body is still to be read
 *   (WHOLE, generation, flags, samples, bad, expected, crc)
 *                                     the reply; `bad` is the first sample whose CRC32C
 *                                     (`crc`) is not the reply's (`expected`), or -1
 * The frame layout it reads is exported (KIND_BATCH ... BATCH_FIXED_BYTES) so that a
 * test holds it to dlfs/formats/datapath_frames.py.
 * Raises TimeoutError (a wait, or the deadline, ran out), ConnectionResetError (the
 * daemon closed in the middle), OSError, and what a signal handler raises.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <poll.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>

/* The wire is little-endian and the frames are read with memcpy: on any other host
 * the build fails, and setup.py's optional extension leaves the Python exchange. */
#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the C exchange reads little-endian frames in place; build without it"
#endif

enum { SEND_FAILED = 0, NOT_BATCH = 1, BATCH_LEFT = 2, NOT_DATA = 3, WHOLE = 4 };
enum { KIND_BATCH = 66, KIND_DATA = 67 };
enum { BATCH_CRCS = 0x1, BATCH_BLOCKS = 0x2 };
enum { FRAME_BYTES = 8, BATCH_FIXED_BYTES = 24, REQUEST_BUFFERS_MAX = 8 };
/* What an I/O step ended with besides success (0). */
enum { IO_ERRNO = -1, IO_TIMEOUT = -2, IO_CLOSED = -3, IO_INTERRUPTED = -4 };

typedef struct {
    int fd;
    double deadline; /* CLOCK_MONOTONIC seconds, as time.monotonic() */
    double wait_s;   /* each wait at most this; negative: only the deadline */
} Conn;

static double monotonic_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* Seconds the next wait may take: within the deadline and the per-wait bound. */
static double wait_left(const Conn *c) {
    double left = c->deadline - monotonic_now();
    if (c->wait_s >= 0 && c->wait_s < left)
        left = c->wait_s;
    return left;
}

/* The longest one poll or SO_RCVTIMEO waits (a day: inside poll's int milliseconds and
 * a timeval's microseconds): a deadline or wait_s farther off (up to infinity) is
 * waited for in turns of this, never converted past an integer's range. */
#define WAIT_TURN_S 86400.0
#define POLL_TURN_MS ((int)(WAIT_TURN_S * 1000.0))

/* Wait until `events` come (0), the deadline or the per-wait bound pass (IO_TIMEOUT),
 * or a signal or an error stops it. */
static int wait_for(const Conn *c, short events) {
    double left = wait_left(c);
    const double until = monotonic_now() + left;
    for (;;) {
        if (left <= 0)
            return IO_TIMEOUT;
        double ms = ceil(left * 1000.0);
        int turn = ms < POLL_TURN_MS ? (int)ms : POLL_TURN_MS;
        struct pollfd p = {c->fd, events, 0};
        int ready = poll(&p, 1, turn);
        if (ready > 0)
            return 0;
        if (ready < 0)
            return errno == EINTR ? IO_INTERRUPTED : IO_ERRNO;
        if (turn < POLL_TURN_MS)
            return IO_TIMEOUT;
        left = until - monotonic_now();
    }
}

/* After a non-blocking call failed: wait for `events` if it would have blocked (0 once
 * they came), else why it stopped. */
static int wait_after_failure(const Conn *c, short events) {
    if (errno == EINTR)
        return IO_INTERRUPTED;
    if (errno != EAGAIN && errno != EWOULDBLOCK)
        return IO_ERRNO;
    return wait_for(c, events);
}

/* Send the iovecs from *at on; *at and the vector advance as bytes go out. */
static int send_vector(const Conn *c, struct iovec *iov, int count, int *at) {
    while (*at < count) {
        struct msghdr m;
        memset(&m, 0, sizeof m);
        m.msg_iov = iov + *at;
        m.msg_iovlen = (size_t)(count - *at);
        ssize_t sent = sendmsg(c->fd, &m, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (sent < 0) {
            int rc = wait_after_failure(c, POLLOUT);
            if (rc)
                return rc;
            continue;
        }
        while (*at < count && (size_t)sent >= iov[*at].iov_len) {
            sent -= (ssize_t)iov[*at].iov_len;
            (*at)++;
        }
        if (*at < count && sent) {
            iov[*at].iov_base = (char *)iov[*at].iov_base + sent;
            iov[*at].iov_len -= (size_t)sent;
        }
    }
    return 0;
}

/* Receive until buf[0:n] is full, from *got on; a poll per empty turn. */
static int recv_exact(const Conn *c, char *buf, size_t n, size_t *got) {
    while (*got < n) {
        ssize_t r = recv(c->fd, buf + *got, n - *got, MSG_DONTWAIT);
        if (r > 0) {
            *got += (size_t)r;
            continue;
        }
        if (r == 0)
            return IO_CLOSED;
        int rc = wait_after_failure(c, POLLIN);
        if (rc)
            return rc;
    }
    return 0;
}

/* As recv_exact, but waiting in the kernel (a blocking MSG_WAITALL receive under
 * SO_RCVTIMEO): one wakeup for a whole frame instead of one per segment the
 * sender's kernel delivers.  The socket's flags and SO_RCVTIMEO are restored. */
static int recv_waiting(const Conn *c, char *buf, size_t n, size_t *got) {
    int flags = fcntl(c->fd, F_GETFL);
    if (flags < 0 || fcntl(c->fd, F_SETFL, flags & ~O_NONBLOCK) < 0)
        return IO_ERRNO;
    int rc = 0;
    double left = wait_left(c);
    const double until = monotonic_now() + left;
    while (*got < n) {
        if (left <= 0) {
            rc = IO_TIMEOUT;
            break;
        }
        double turn = left < WAIT_TURN_S ? left : WAIT_TURN_S;
        long micros = (long)ceil(turn * 1e6);
        struct timeval tv = {micros / 1000000, micros % 1000000};
        if (setsockopt(c->fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv) < 0) {
            rc = IO_ERRNO;
            break;
        }
        ssize_t r = recv(c->fd, buf + *got, n - *got, MSG_WAITALL);
        if (r > 0) {
            *got += (size_t)r;
            if (*got < n) {
                rc = IO_INTERRUPTED; /* a signal (or SO_RCVTIMEO) cut it short: let the
                                        handler run, then go on */
                break;
            }
            continue;
        }
        if (r == 0) {
            rc = IO_CLOSED;
        } else if (errno == EINTR) {
            rc = IO_INTERRUPTED;
        } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
            if (turn == WAIT_TURN_S) { /* a turn of a longer wait ended */
                left = until - monotonic_now();
                continue;
            }
            rc = IO_TIMEOUT; /* SO_RCVTIMEO ran out with nothing received */
        } else {
            rc = IO_ERRNO;
        }
        break;
    }
    int saved = errno;
    struct timeval zero = {0, 0};
    setsockopt(c->fd, SOL_SOCKET, SO_RCVTIMEO, &zero, sizeof zero);
    fcntl(c->fd, F_SETFL, flags);
    errno = saved;
    return rc;
}

/* Raise what an I/O step's `rc` means; NULL. */
static PyObject *raise_io(int rc) {
    if (rc == IO_TIMEOUT) {
        PyErr_SetString(PyExc_TimeoutError, "timed out");
    } else if (rc == IO_CLOSED) {
        PyObject *args = Py_BuildValue("(is)", 0, "connection closed in the middle of a frame");
        if (args) {
            PyErr_SetObject(PyExc_ConnectionResetError, args);
            Py_DECREF(args);
        }
    } else {
        PyErr_SetFromErrno(PyExc_OSError);
    }
    return NULL;
}

/* Run one I/O step without the interpreter lock; a signal runs its Python handler
 * (which may raise) and the step goes on where it stopped.  Evaluates to its rc, or
 * IO_INTERRUPTED with an exception set. */
#define RUN_IO(rc, step)                                    \
    for (;;) {                                              \
        Py_BEGIN_ALLOW_THREADS rc = (step);                 \
        Py_END_ALLOW_THREADS if (rc != IO_INTERRUPTED) break; \
        if (PyErr_CheckSignals() < 0) break;                \
    }

static uint64_t le64(const char *p) {
    uint64_t v;
    memcpy(&v, p, 8);
    return v; /* little-endian, as the wire (checked at the top) */
}

static uint32_t le32(const char *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* The reply's samples: a view of each (of one memoryview of the whole payload) and,
 * with `crc32c` (not None), its CRC32C checked against the reply's; `*bad` is the
 * first that differs (with `*expected` and `*got`), or stays -1.  Called once the
 * whole payload arrived: checking each window while the next is on its way (as the
 * Python exchange's ReplyChecker does) took two cores that the client shares with the
 * daemon more time, not less (docs/DESIGN.md, "Client and transports"). */
static PyObject *cut_and_check(PyObject *target, int readonly, const char *lengths,
                               const char *crcs, uint32_t count, PyObject *crc32c,
                               Py_ssize_t *bad, unsigned long *expected,
                               unsigned long *got) {
    PyObject *base = PyMemoryView_FromObject(target);
    if (base == NULL)
        return NULL;
    if (readonly) {
        PyObject *frozen = PyObject_CallMethod(base, "toreadonly", NULL);
        Py_DECREF(base);
        if (frozen == NULL)
            return NULL;
        base = frozen;
    }
    PyObject *samples = PyList_New(count);
    if (samples == NULL)
        goto fail;
    Py_ssize_t at = 0;
    for (uint32_t i = 0; i < count; i++) {
        Py_ssize_t end = at + (Py_ssize_t)le64(lengths + 8 * (size_t)i);
        PyObject *view = PySequence_GetSlice(base, at, end);
        if (view == NULL)
            goto fail;
        PyList_SET_ITEM(samples, i, view);
        at = end;
        if (crc32c == Py_None)
            continue;
        PyObject *value = PyObject_CallOneArg(crc32c, view);
        if (value == NULL)
            goto fail;
        unsigned long crc = PyLong_AsUnsignedLong(value);
        Py_DECREF(value);
        if (crc == (unsigned long)-1 && PyErr_Occurred())
            goto fail;
        unsigned long wanted = le32(crcs + 4 * (size_t)i);
        if (*bad < 0 && crc != wanted) {
            *bad = (Py_ssize_t)i;
            *expected = wanted;
            *got = crc;
        }
    }
    Py_DECREF(base);
    return samples;
fail:
    Py_XDECREF(samples);
    Py_DECREF(base);
    return NULL;
}

static PyObject *get_batch(PyObject *module, PyObject *args) {
    (void)module;
    Conn c;
    PyObject *request, *take, *crc32c;
    Py_ssize_t header_bytes_max;
    int readonly;
    if (!PyArg_ParseTuple(args, "iO!ddnOOp:get_batch", &c.fd, &PyList_Type, &request,
                          &c.deadline, &c.wait_s, &header_bytes_max, &take, &crc32c,
                          &readonly))
        return NULL;
    Py_ssize_t buffers = PyList_GET_SIZE(request);
    if (buffers > REQUEST_BUFFERS_MAX) {
        PyErr_Format(PyExc_ValueError, "a request of %zd buffers (at most %d)", buffers,
                     REQUEST_BUFFERS_MAX);
        return NULL;
    }

    /* The request. */
    Py_buffer held[REQUEST_BUFFERS_MAX];
    struct iovec iov[REQUEST_BUFFERS_MAX];
    int count = 0, rc = 0;
    Py_ssize_t taken = 0;
    for (; taken < buffers; taken++) {
        if (PyObject_GetBuffer(PyList_GET_ITEM(request, taken), &held[taken],
                               PyBUF_SIMPLE) < 0)
            break;
        if (held[taken].len) {
            iov[count].iov_base = held[taken].buf;
            iov[count].iov_len = (size_t)held[taken].len;
            count++;
        }
    }
    int sent = 0;
    if (taken == buffers)
        RUN_IO(rc, send_vector(&c, iov, count, &sent));
    int send_errno = errno;
    for (Py_ssize_t i = 0; i < taken; i++)
        PyBuffer_Release(&held[i]);
    if (taken < buffers || PyErr_Occurred())
        return NULL;
    if (rc == IO_TIMEOUT)
        return Py_BuildValue("(ii)", SEND_FAILED, 0);
    if (rc)
        return Py_BuildValue("(ii)", SEND_FAILED, send_errno);

    /* The BATCH frame. */
    char header[FRAME_BYTES];
    size_t got = 0;
    RUN_IO(rc, recv_exact(&c, header, FRAME_BYTES, &got));
    if (rc)
        return PyErr_Occurred() ? NULL : raise_io(rc);
    unsigned kind = (unsigned char)header[0];
    uint32_t length = le32(header + 4);
    if (kind != KIND_BATCH || (Py_ssize_t)length > header_bytes_max)
        return Py_BuildValue("(iII)", NOT_BATCH, kind, length);
    PyObject *body = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)length);
    if (body == NULL)
        return NULL;
    char *fixed = PyBytes_AS_STRING(body);
    got = 0;
    RUN_IO(rc, recv_exact(&c, fixed, length, &got));
    if (rc) {
        Py_DECREF(body);
        return PyErr_Occurred() ? NULL : raise_io(rc);
    }
    if (length < BATCH_FIXED_BYTES)
        return Py_BuildValue("(iN)", BATCH_LEFT, body);
    uint64_t generation = le64(fixed), payload = le64(fixed + 8);
    uint32_t samples = le32(fixed + 16), flags = le32(fixed + 20);
    if ((flags & BATCH_BLOCKS) ||
        (uint64_t)length != BATCH_FIXED_BYTES + 12 * (uint64_t)samples)
        return Py_BuildValue("(iN)", BATCH_LEFT, body);
    const char *lengths = fixed + BATCH_FIXED_BYTES;
    const char *crcs = lengths + 8 * (size_t)samples;
    uint64_t total = 0;
    for (uint32_t i = 0; i < samples; i++) {
        uint64_t piece = le64(lengths + 8 * (size_t)i);
        if (piece > PY_SSIZE_T_MAX - total)
            return Py_BuildValue("(iN)", BATCH_LEFT, body); /* cannot add up */
        total += piece;
    }
    if (total != payload)
        return Py_BuildValue("(iN)", BATCH_LEFT, body);

    /* The payload, DATA frame by DATA frame. */
    PyObject *target = PyObject_CallFunction(take, "K", (unsigned long long)payload);
    if (target == NULL) {
        Py_DECREF(body);
        return NULL;
    }
    Py_buffer into;
    if (PyObject_GetBuffer(target, &into, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0)
        goto fail;
    if ((uint64_t)into.len < payload) {
        PyBuffer_Release(&into);
        PyErr_SetString(PyExc_ValueError, "take(n) gave a buffer shorter than n");
        goto fail;
    }
    size_t filled = 0;
    while (filled < payload) {
        got = 0;
        RUN_IO(rc, recv_exact(&c, header, FRAME_BYTES, &got));
        if (rc)
            break;
        kind = (unsigned char)header[0];
        length = le32(header + 4);
        if (kind != KIND_DATA || length > payload - filled) {
            PyBuffer_Release(&into);
            Py_DECREF(target);
            Py_DECREF(body);
            return Py_BuildValue("(iII)", NOT_DATA, kind, length);
        }
        got = 0;
        RUN_IO(rc, recv_waiting(&c, (char *)into.buf + filled, length, &got));
        if (rc)
            break;
        filled += length;
    }
    PyBuffer_Release(&into);
    if (rc) {
        if (!PyErr_Occurred())
            raise_io(rc);
        goto fail;
    }
    Py_ssize_t bad = -1;
    unsigned long expected = 0, crc = 0;
    PyObject *views = cut_and_check(target, readonly, lengths, crcs, samples,
                                    (flags & BATCH_CRCS) ? crc32c : Py_None, &bad, &expected,
                                    &crc);
    Py_DECREF(target);
    Py_DECREF(body); /* `lengths` and `crcs` pointed into it */
    if (views == NULL)
        return NULL;
    return Py_BuildValue("(iKINnkk)", WHOLE, (unsigned long long)generation, flags, views,
                         bad, expected, crc);
fail:
    Py_DECREF(target);
    Py_DECREF(body);
    return NULL;
}

static PyMethodDef methods[] = {
    {"get_batch", get_batch, METH_VARARGS,
     "One GET_BATCH exchange on a connected data path socket (see the module's source)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "native_exchange",
    "One GET_BATCH exchange of the data path's client in a single call.", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit_native_exchange(void) {
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    if (PyModule_AddIntConstant(m, "SEND_FAILED", SEND_FAILED) < 0 ||
        PyModule_AddIntConstant(m, "NOT_BATCH", NOT_BATCH) < 0 ||
        PyModule_AddIntConstant(m, "BATCH_LEFT", BATCH_LEFT) < 0 ||
        PyModule_AddIntConstant(m, "NOT_DATA", NOT_DATA) < 0 ||
        PyModule_AddIntConstant(m, "WHOLE", WHOLE) < 0 ||
        PyModule_AddIntConstant(m, "REQUEST_BUFFERS_MAX", REQUEST_BUFFERS_MAX) < 0 ||
        PyModule_AddIntConstant(m, "KIND_BATCH", KIND_BATCH) < 0 ||
        PyModule_AddIntConstant(m, "KIND_DATA", KIND_DATA) < 0 ||
        PyModule_AddIntConstant(m, "BATCH_CRCS", BATCH_CRCS) < 0 ||
        PyModule_AddIntConstant(m, "BATCH_BLOCKS", BATCH_BLOCKS) < 0 ||
        PyModule_AddIntConstant(m, "FRAME_BYTES", FRAME_BYTES) < 0 ||
        PyModule_AddIntConstant(m, "BATCH_FIXED_BYTES", BATCH_FIXED_BYTES) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
