/* The frame loop of adapters/_eventstream.py in C: ``scan`` walks the AWS event-stream messages of one
 * buffer, checks both CRC-32s and the limits, and returns what ``_scan_py`` (its pure-Python twin, the
 * fallback when this module is not built) returns, byte for byte and message for message. And
 * ``chunk_events``: the base64-decoded events of InvokeModelWithResponseStream chunk payloads of Bedrock's
 * exact shape (adapters/_bedrock_stream.py falls back to msgspec for any other); and ``encode_chunks``, the
 * inverse: events as chunk messages for a Bedrock client (``encode_chunks_py``, its twin, when not built).
 *
 * Optional: setup.py builds it when a C compiler is there. Nothing but the CPython C API and its own
 * CRC-32 (below; no library to link). See docs/benchmarks.md for what it saves.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define MAX_HEADERS_LENGTH (128 * 1024)
#define MAX_PAYLOAD_LENGTH (24 * 1024 * 1024)
#define MIN_LENGTH 16 /* prelude (12) + message CRC (4) */

/* CRC-32 (zlib's: reflected polynomial 0xEDB88320). By table, slicing by 8 bytes; and, on x86-64 CPUs
 * with PCLMULQDQ (checked at import), by carry-less multiplication for all but the last <16 bytes of
 * inputs of 64 bytes or more (4 x 128-bit folding and Barrett reduction, as in Intel's white paper "Fast
 * CRC Computation for Generic Polynomials Using PCLMULQDQ", the constants of Linux's crc32-pclmul and
 * Chromium's zlib): no 8 KiB of tables to keep in cache, the reason the Python side uses python-isal.
 * -DEVENTSTREAM_ZLIB: zlib's crc32() instead (link -lz), for comparison. */
static uint32_t crc_table[8][256];

static void crc_table_init(void)
{
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++)
            c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
        crc_table[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; i++)
        for (int t = 1; t < 8; t++)
            crc_table[t][i] = (crc_table[t - 1][i] >> 8) ^ crc_table[0][crc_table[t - 1][i] & 0xFF];
}

static uint32_t crc32_by_table(uint32_t crc, const unsigned char *p, size_t n)
{
    crc = ~crc;
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    while (n >= 8) {
        uint32_t lo, hi;
        memcpy(&lo, p, 4);
        memcpy(&hi, p + 4, 4);
        lo ^= crc;
        crc = crc_table[7][lo & 0xFF] ^ crc_table[6][(lo >> 8) & 0xFF] ^ crc_table[5][(lo >> 16) & 0xFF] ^
              crc_table[4][lo >> 24] ^ crc_table[3][hi & 0xFF] ^ crc_table[2][(hi >> 8) & 0xFF] ^
              crc_table[1][(hi >> 16) & 0xFF] ^ crc_table[0][hi >> 24];
        p += 8;
        n -= 8;
    }
#endif
    while (n--)
        crc = crc_table[0][(crc ^ *p++) & 0xFF] ^ (crc >> 8);
    return ~crc;
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(EVENTSTREAM_ZLIB)
#define HAVE_CLMUL 1
#include <immintrin.h>

static int use_clmul;

/* The CRC state (not inverted) after ``len`` bytes, ``len`` >= 64 and a multiple of 16. */
__attribute__((target("pclmul,sse4.1"))) static uint32_t crc32_clmul(uint32_t state, const unsigned char *buf,
                                                                      size_t len)
{
    const __m128i k1k2 = _mm_set_epi64x(0x01c6e41596, 0x0154442bd4);
    const __m128i k3k4 = _mm_set_epi64x(0x00ccaa009e, 0x01751997d0);
    const __m128i k5k0 = _mm_set_epi64x(0, 0x0163cd6124);
    const __m128i poly = _mm_set_epi64x(0x01f7011641, 0x01db710641);
    const __m128i mask32 = _mm_setr_epi32(~0, 0, ~0, 0);
    __m128i x0, x1, x2, x3, x4, x5, x6, x7, x8;

    x1 = _mm_loadu_si128((const __m128i *)(buf + 0x00));
    x2 = _mm_loadu_si128((const __m128i *)(buf + 0x10));
    x3 = _mm_loadu_si128((const __m128i *)(buf + 0x20));
    x4 = _mm_loadu_si128((const __m128i *)(buf + 0x30));
    x1 = _mm_xor_si128(x1, _mm_cvtsi32_si128((int)state));
    x0 = k1k2;
    buf += 64;
    len -= 64;
    while (len >= 64) { /* fold four 128-bit lanes in parallel */
        x5 = _mm_clmulepi64_si128(x1, x0, 0x00);
        x6 = _mm_clmulepi64_si128(x2, x0, 0x00);
        x7 = _mm_clmulepi64_si128(x3, x0, 0x00);
        x8 = _mm_clmulepi64_si128(x4, x0, 0x00);
        x1 = _mm_clmulepi64_si128(x1, x0, 0x11);
        x2 = _mm_clmulepi64_si128(x2, x0, 0x11);
        x3 = _mm_clmulepi64_si128(x3, x0, 0x11);
        x4 = _mm_clmulepi64_si128(x4, x0, 0x11);
        x1 = _mm_xor_si128(_mm_xor_si128(x1, x5), _mm_loadu_si128((const __m128i *)(buf + 0x00)));
        x2 = _mm_xor_si128(_mm_xor_si128(x2, x6), _mm_loadu_si128((const __m128i *)(buf + 0x10)));
        x3 = _mm_xor_si128(_mm_xor_si128(x3, x7), _mm_loadu_si128((const __m128i *)(buf + 0x20)));
        x4 = _mm_xor_si128(_mm_xor_si128(x4, x8), _mm_loadu_si128((const __m128i *)(buf + 0x30)));
        buf += 64;
        len -= 64;
    }
    x0 = k3k4; /* the four lanes into one */
    x5 = _mm_clmulepi64_si128(x1, x0, 0x00);
    x1 = _mm_clmulepi64_si128(x1, x0, 0x11);
    x1 = _mm_xor_si128(_mm_xor_si128(x1, x2), x5);
    x5 = _mm_clmulepi64_si128(x1, x0, 0x00);
    x1 = _mm_clmulepi64_si128(x1, x0, 0x11);
    x1 = _mm_xor_si128(_mm_xor_si128(x1, x3), x5);
    x5 = _mm_clmulepi64_si128(x1, x0, 0x00);
    x1 = _mm_clmulepi64_si128(x1, x0, 0x11);
    x1 = _mm_xor_si128(_mm_xor_si128(x1, x4), x5);
    while (len >= 16) { /* the remaining 16-byte blocks */
        x2 = _mm_loadu_si128((const __m128i *)buf);
        x5 = _mm_clmulepi64_si128(x1, x0, 0x00);
        x1 = _mm_clmulepi64_si128(x1, x0, 0x11);
        x1 = _mm_xor_si128(_mm_xor_si128(x1, x2), x5);
        buf += 16;
        len -= 16;
    }
    /* 128 bits to 64 */
    x2 = _mm_clmulepi64_si128(x1, x0, 0x10);
    x1 = _mm_xor_si128(_mm_srli_si128(x1, 8), x2);
    x0 = k5k0;
    x2 = _mm_srli_si128(x1, 4);
    x1 = _mm_and_si128(x1, mask32);
    x1 = _mm_xor_si128(_mm_clmulepi64_si128(x1, x0, 0x00), x2);
    /* Barrett reduction to 32 bits */
    x0 = poly;
    x2 = _mm_and_si128(x1, mask32);
    x2 = _mm_clmulepi64_si128(x2, x0, 0x10);
    x2 = _mm_and_si128(x2, mask32);
    x2 = _mm_clmulepi64_si128(x2, x0, 0x00);
    x1 = _mm_xor_si128(x1, x2);
    return (uint32_t)_mm_extract_epi32(x1, 1);
}
#endif

#ifdef EVENTSTREAM_ZLIB
#include <zlib.h>
#define CRC_NAME "zlib"
static void crc_init(void) { crc_table_init(); }
static inline uint32_t crc32_update(uint32_t crc, const unsigned char *p, size_t n)
{
    while (n > 0x40000000u) { /* zlib takes an unsigned int length */
        crc = (uint32_t)crc32(crc, p, 0x40000000u);
        p += 0x40000000u;
        n -= 0x40000000u;
    }
    return (uint32_t)crc32(crc, p, (uInt)n);
}
#else
static const char *crc_name(void)
{
#ifdef HAVE_CLMUL
    if (use_clmul)
        return "pclmul";
#endif
    return "slicing-by-8";
}
#define CRC_NAME crc_name()

static void crc_init(void)
{
    crc_table_init();
#ifdef HAVE_CLMUL
    __builtin_cpu_init();
    use_clmul = __builtin_cpu_supports("pclmul") && __builtin_cpu_supports("sse4.1");
#endif
}

static inline uint32_t crc32_update(uint32_t crc, const unsigned char *p, size_t n)
{
#ifdef HAVE_CLMUL
    if (use_clmul && n >= 64) {
        size_t blocks = n & ~(size_t)15;
        crc = ~crc32_clmul(~crc, p, blocks);
        p += blocks;
        n -= blocks;
    }
#endif
    return crc32_by_table(crc, p, n);
}
#endif

static inline uint32_t be32(const unsigned char *p)
{
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | (uint32_t)p[3];
}

/* The named results, PyStructSequence types (tuples with named fields, like os.stat_result): created by the
 * exec slot into the module's state (so each module object, and each interpreter, has its own) and exposed as
 * module attributes. */
typedef struct {
    PyTypeObject *ScanResult, *ChunkBatch;
} ModuleState;

static ModuleState *module_state(PyObject *module) { return (ModuleState *)PyModule_GetState(module); }

/* A new ``type`` (a PyStructSequence type of ``n`` fields) holding ``items``, each stolen; NULL, every item
 * released, when one of them is NULL (its creation failed) or on error.
 *
 * Allocated by the type's tp_alloc, not PyStructSequence_New: that one looks n_fields and n_sequence_fields
 * up in the type's dict on every call, which made a call over a few events 10-20% slower than with a plain
 * tuple. With every field in the sequence, as in all of this module's types, both are ``n`` and the object is
 * the same (a tuple of ``n`` items, NULL until set, holding a reference to its heap type), only GC-tracked
 * from the start. */
static PyObject *structseq_of(PyTypeObject *type, PyObject *const *items, Py_ssize_t n)
{
    PyObject *result = NULL;
    for (Py_ssize_t i = 0; i < n; i++)
        if (items[i] == NULL)
            goto fail;
    if ((result = type->tp_alloc(type, n)) == NULL)
        goto fail;
    for (Py_ssize_t i = 0; i < n; i++)
        PyStructSequence_SET_ITEM(result, i, items[i]);
    return result;

fail:
    for (Py_ssize_t i = 0; i < n; i++)
        Py_XDECREF(items[i]);
    return NULL;
}

static PyStructSequence_Field scan_result_fields[] = {
    {"payloads", "the payloads of the leading run of messages whose header block is the known one"},
    {"frames", "every message from the first other one on, as (header bytes, payload)"},
    {"offset", "the offset of the first byte not consumed"},
    {"error", "None, or the message of the damage that stopped the walk"},
    {NULL, NULL},
};

static PyStructSequence_Desc scan_result_desc = {
    "adapters._eventstream_c.ScanResult", "What scan() answers: the complete messages of a buffer.",
    scan_result_fields, 4,
};

PyDoc_STRVAR(scan_doc,
"scan(buf, known, /) -> ScanResult(payloads, frames, offset, error)\n\n"
"The complete messages of ``buf`` from its start: the payloads of the leading run of messages whose\n"
"header block equals ``known`` (bytes, or None for no such run), then every message from the first\n"
"other one on as ``(header bytes, payload)``; the offset of the first byte not consumed; and None, or\n"
"the message of the damage that stopped the walk (the frames before it are intact).");

/* One message that ``check_frame`` found intact. */
typedef struct {
    uint32_t total;                       /* its length */
    const char *headers, *payload;        /* where its header block and payload are */
    Py_ssize_t headers_length, payload_length;
} Frame;

enum { FRAME_DAMAGED = -1, FRAME_INCOMPLETE = 0, FRAME_INTACT = 1 };

/* The message at ``p``, ``left`` (>= MIN_LENGTH) bytes from it to the end of the buffer: FRAME_INTACT and
 * ``*frame``; FRAME_INCOMPLETE when not all of it is there yet (within the limits); FRAME_DAMAGED and
 * ``*error`` the message saying how (NULL, with an exception set, when creating it failed). */
static int check_frame(const unsigned char *p, Py_ssize_t left, Frame *frame, PyObject **error)
{
    const uint32_t total = be32(p), headers_length = be32(p + 4), prelude_crc = be32(p + 8);
    uint32_t crc = crc32_update(0, p, 8);
    if (crc != prelude_crc) {
        *error = PyUnicode_FromString("event-stream prelude CRC mismatch");
        return FRAME_DAMAGED;
    }
    if ((uint64_t)left < (uint64_t)total) {
        if (headers_length <= MAX_HEADERS_LENGTH &&
            (int64_t)total - (int64_t)headers_length - MIN_LENGTH <= MAX_PAYLOAD_LENGTH)
            return FRAME_INCOMPLETE;
        *error = PyUnicode_FromFormat("event-stream message of %lu bytes exceeds the limits", (unsigned long)total);
        return FRAME_DAMAGED;
    }
    if ((uint64_t)total < (uint64_t)headers_length + MIN_LENGTH) {
        *error = PyUnicode_FromString("event-stream message shorter than its own headers");
        return FRAME_DAMAGED;
    }
    crc = crc32_update(crc, p + 8, (size_t)total - 12);
    if (crc != be32(p + total - 4)) {
        *error = PyUnicode_FromString("event-stream message CRC mismatch");
        return FRAME_DAMAGED;
    }
    frame->total = total;
    frame->headers = (const char *)p + 12;
    frame->headers_length = (Py_ssize_t)headers_length;
    frame->payload = frame->headers + headers_length;
    frame->payload_length = (Py_ssize_t)total - MIN_LENGTH - (Py_ssize_t)headers_length;
    return FRAME_INTACT;
}

/* The walk of ``scan`` over one buffer: the lists it fills, and the header block of the leading run. */
typedef struct {
    int in_run;                   /* still in the leading run of messages whose header block is ``known`` */
    const char *known;
    Py_ssize_t known_length;
    PyObject *payloads, *frames;  /* the two lists of the result (owned) */
    PyObject *last_headers;       /* borrowed from ``frames``: equal header blocks share one object */
} FrameScan;

/* The header block of ``frame`` as bytes (a new reference): the previous pair's object when they are equal. */
static PyObject *header_block(const FrameScan *s, const Frame *frame)
{
    PyObject *last = s->last_headers;
    if (last != NULL && PyBytes_GET_SIZE(last) == frame->headers_length &&
        memcmp(PyBytes_AS_STRING(last), frame->headers, (size_t)frame->headers_length) == 0)
        return Py_NewRef(last);
    return PyBytes_FromStringAndSize(frame->headers, frame->headers_length);
}

/* ``(header bytes, payload)`` of ``frame`` appended to the frames (``payload`` stolen). */
static int add_pair(FrameScan *s, const Frame *frame, PyObject *payload)
{
    PyObject *raw = header_block(s, frame);
    if (raw == NULL) {
        Py_DECREF(payload);
        return -1;
    }
    PyObject *pair = PyTuple_New(2);
    if (pair == NULL) {
        Py_DECREF(raw);
        Py_DECREF(payload);
        return -1;
    }
    PyTuple_SET_ITEM(pair, 0, raw); /* steals both */
    PyTuple_SET_ITEM(pair, 1, payload);
    const int rc = PyList_Append(s->frames, pair);
    Py_DECREF(pair);
    if (rc < 0)
        return -1;
    s->last_headers = raw; /* kept alive by ``frames`` */
    return 0;
}

/* An intact message: its payload appended to the payloads while the leading run lasts, else to the frames
 * as a pair. */
static int add_frame(FrameScan *s, const Frame *frame)
{
    PyObject *payload = PyBytes_FromStringAndSize(frame->payload, frame->payload_length);
    if (payload == NULL)
        return -1;
    if (s->in_run && frame->headers_length == s->known_length &&
        memcmp(frame->headers, s->known, (size_t)frame->headers_length) == 0) {
        const int rc = PyList_Append(s->payloads, payload);
        Py_DECREF(payload);
        return rc;
    }
    s->in_run = 0;
    return add_pair(s, frame, payload);
}

/* Every complete message of ``buf`` from its start into ``s``; ``*offset`` the first byte not consumed and
 * ``*error`` None or the message of the damage that stopped the walk (a new reference). -1 on error. */
static int scan_frames(FrameScan *s, const unsigned char *buf, Py_ssize_t size, Py_ssize_t *offset,
                       PyObject **error)
{
    Py_ssize_t start = 0;
    Frame frame;
    while (size - start >= MIN_LENGTH && check_frame(buf + start, size - start, &frame, error) == FRAME_INTACT) {
        if (add_frame(s, &frame) < 0)
            return -1;
        start += frame.total;
    }
    if (*error == NULL) {
        if (PyErr_Occurred())
            return -1;
        *error = Py_NewRef(Py_None);
    }
    *offset = start;
    return 0;
}

/* 0 when the arguments are (bytes, bytes or None); else -1 with a TypeError. */
static int check_scan_args(PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "scan() takes exactly 2 arguments");
        return -1;
    }
    if (!PyBytes_Check(args[0])) {
        PyErr_Format(PyExc_TypeError, "scan() argument 1 must be bytes, not %.100s", Py_TYPE(args[0])->tp_name);
        return -1;
    }
    if (args[1] != Py_None && !PyBytes_Check(args[1])) {
        PyErr_Format(PyExc_TypeError, "scan() argument 2 must be bytes or None, not %.100s",
                     Py_TYPE(args[1])->tp_name);
        return -1;
    }
    return 0;
}

static PyObject *scan(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (check_scan_args(args, nargs) < 0)
        return NULL;
    PyObject *known = args[1];
    FrameScan s = {
        .in_run = known != Py_None,
        .known = known != Py_None ? PyBytes_AS_STRING(known) : NULL,
        .known_length = known != Py_None ? PyBytes_GET_SIZE(known) : -1,
        .payloads = PyList_New(0),
        .frames = PyList_New(0),
    };
    PyObject *error = NULL;
    Py_ssize_t offset = 0;
    if (s.payloads == NULL || s.frames == NULL ||
        scan_frames(&s, (const unsigned char *)PyBytes_AS_STRING(args[0]), PyBytes_GET_SIZE(args[0]), &offset,
                    &error) < 0) {
        Py_XDECREF(s.payloads);
        Py_XDECREF(s.frames);
        Py_XDECREF(error);
        return NULL;
    }
    PyObject *items[] = {s.payloads, s.frames, PyLong_FromSsize_t(offset), error};
    return structseq_of(module_state(module)->ScanResult, items, 4);
}

/* ``name(data, value=0, /)``: the CRC-32 of ``data`` by ``crc``, continuing from ``value``. */
static PyObject *crc32_call(const char *name, uint32_t (*crc)(uint32_t, const unsigned char *, size_t),
                            PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs < 1 || nargs > 2) {
        PyErr_Format(PyExc_TypeError, "%s() takes 1 or 2 arguments", name);
        return NULL;
    }
    uint32_t value = 0;
    if (nargs == 2) {
        value = (uint32_t)PyLong_AsUnsignedLongMask(args[1]);
        if (PyErr_Occurred())
            return NULL;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0)
        return NULL;
    value = crc(value, (const unsigned char *)view.buf, (size_t)view.len);
    PyBuffer_Release(&view);
    return PyLong_FromUnsignedLong(value);
}

PyDoc_STRVAR(crc32_doc, "crc32(data, value=0, /) -> int\n\nzlib's CRC-32 of ``data``, continuing from ``value``.");

static PyObject *crc32_py(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    return crc32_call("crc32", crc32_update, args, nargs);
}

PyDoc_STRVAR(crc32_table_doc, "_crc32_table(data, value=0, /) -> int\n\n``crc32`` by table only (for the tests).");

static PyObject *crc32_table_py(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    return crc32_call("_crc32_table", crc32_by_table, args, nargs);
}

/* ``chunk_events``: the event bytes of InvokeModelWithResponseStream chunk payloads, for the one shape
 * Bedrock sends (docs/wire-formats.md §3.4): ``{"bytes":"<base64>"}`` or ``{"bytes":"<base64>","p":"<padding>"}``,
 * byte for byte. Anything else (whitespace, other or reordered members, escapes, base64 that is not
 * canonical, padding with a control, non-ASCII byte, quote or backslash) is left to msgspec: None. */
static unsigned char b64_values[256]; /* 0..63, or 0xFF: not a base64 digit ('=' included) */
static unsigned char pad_ok[256];     /* 1: a byte the padding may hold (printable ASCII or DEL, not " or \) */

static const char b64_digits[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

static void b64_init(void)
{
    memset(b64_values, 0xFF, sizeof b64_values);
    for (int i = 0; i < 64; i++)
        b64_values[(unsigned char)b64_digits[i]] = (unsigned char)i;
    for (int c = 0; c < 256; c++)
        pad_ok[c] = c >= 0x20 && c < 0x80 && c != '"' && c != '\\';
}

#define CHUNK_HEAD "{\"bytes\":\""  /* 10 bytes */
#define CHUNK_PAD ",\"p\":\""       /* 6 bytes */
#define CHUNK_HEAD_LENGTH (sizeof CHUNK_HEAD - 1)
#define CHUNK_PAD_LENGTH (sizeof CHUNK_PAD - 1)

/* Where the base64 of one payload is (``*digits``, ``*length``; ``*pads``: its trailing '=' count) and
 * how many bytes it decodes to; -1 when the payload is not of the shape. */
static Py_ssize_t chunk_shape(const unsigned char *p, Py_ssize_t n, const unsigned char **digits_out,
                              Py_ssize_t *length_out, Py_ssize_t *pads_out)
{
    if (n < (Py_ssize_t)CHUNK_HEAD_LENGTH + 2 || memcmp(p, CHUNK_HEAD, CHUNK_HEAD_LENGTH) != 0)
        return -1;
    const unsigned char *digits = p + CHUNK_HEAD_LENGTH, *end = p + n;
    const unsigned char *quote = memchr(digits, '"', (size_t)(end - digits));
    if (quote == NULL)
        return -1;
    /* after the base64: "}" alone, or ,"p":"<padding>"} */
    const unsigned char *rest = quote + 1;
    if (end - rest == 1) {
        if (rest[0] != '}')
            return -1;
    }
    else {
        if (end - rest < (Py_ssize_t)CHUNK_PAD_LENGTH + 2 || memcmp(rest, CHUNK_PAD, CHUNK_PAD_LENGTH) != 0 ||
            end[-2] != '"' || end[-1] != '}')
            return -1;
        for (const unsigned char *c = rest + CHUNK_PAD_LENGTH; c < end - 2; c++)
            if (!pad_ok[*c])
                return -1;
    }
    const Py_ssize_t length = quote - digits;
    if (length % 4 != 0)
        return -1;
    Py_ssize_t pads = 0;
    if (length > 0 && digits[length - 1] == '=')
        pads = digits[length - 2] == '=' ? 2 : 1;
    *digits_out = digits;
    *length_out = length;
    *pads_out = pads;
    return length / 4 * 3 - pads;
}

/* Decode canonical base64 (``length`` digits, the last ``pads`` of them '=') into ``o``; -1 when a digit
 * is not base64 or the unused bits of the last quad are not zero. */
static int b64_decode(const unsigned char *digits, Py_ssize_t length, Py_ssize_t pads, unsigned char *o)
{
    const Py_ssize_t full = pads ? length - 4 : length; /* the quads without '=' */
    Py_ssize_t i = 0;
    for (; i < full; i += 4) {
        const unsigned a = b64_values[digits[i]], b = b64_values[digits[i + 1]], c = b64_values[digits[i + 2]],
                       d = b64_values[digits[i + 3]];
        if ((a | b | c | d) & 0x80)
            return -1;
        const uint32_t v = (a << 18) | (b << 12) | (c << 6) | d;
        *o++ = (unsigned char)(v >> 16);
        *o++ = (unsigned char)(v >> 8);
        *o++ = (unsigned char)v;
    }
    if (pads) { /* the last quad: xx== or xxx=, with the unused bits zero (the canonical form) */
        const unsigned a = b64_values[digits[i]], b = b64_values[digits[i + 1]];
        if ((a | b) & 0x80)
            return -1;
        if (pads == 2) {
            if (b & 0x0F)
                return -1;
            *o++ = (unsigned char)((a << 2) | (b >> 4));
        }
        else {
            const unsigned c = b64_values[digits[i + 2]];
            if ((c & 0x80) || (c & 0x03))
                return -1;
            *o++ = (unsigned char)((a << 2) | (b >> 4));
            *o++ = (unsigned char)(((b & 0x0F) << 4) | (c >> 2));
        }
    }
    return 0;
}

/* The decoded bytes of one payload, or NULL with no exception set when it is not of the shape (or NULL
 * with an exception when out of memory). */
static PyObject *chunk_event(const unsigned char *p, Py_ssize_t n)
{
    const unsigned char *digits;
    Py_ssize_t length, pads;
    const Py_ssize_t out_length = chunk_shape(p, n, &digits, &length, &pads);
    if (out_length < 0)
        return NULL;
    PyObject *out = PyBytes_FromStringAndSize(NULL, out_length);
    if (out == NULL)
        return NULL;
    if (b64_decode(digits, length, pads, (unsigned char *)PyBytes_AS_STRING(out)) < 0) {
        Py_DECREF(out);
        return NULL;
    }
    return out;
}

/* 0 when ``payloads`` is a list of bytes; else -1 with a TypeError naming ``function``. */
static int check_payloads(const char *function, PyObject *payloads)
{
    if (!PyList_Check(payloads)) {
        PyErr_Format(PyExc_TypeError, "%s() argument must be list, not %.100s", function, Py_TYPE(payloads)->tp_name);
        return -1;
    }
    for (Py_ssize_t k = 0; k < PyList_GET_SIZE(payloads); k++) {
        PyObject *payload = PyList_GET_ITEM(payloads, k);
        if (!PyBytes_Check(payload)) {
            PyErr_Format(PyExc_TypeError, "%s() items must be bytes, not %.100s", function, Py_TYPE(payload)->tp_name);
            return -1;
        }
    }
    return 0;
}

PyDoc_STRVAR(chunk_events_doc,
"chunk_events(payloads, /) -> list[bytes] | None\n\n"
"The event bytes (base64-decoded ``bytes`` member) of every InvokeModelWithResponseStream chunk payload of\n"
"the list, when each is exactly ``{\"bytes\":\"<base64>\"}`` or ``{\"bytes\":\"<base64>\",\"p\":\"<padding>\"}``\n"
"(canonical base64; padding of printable ASCII without quote or backslash); None as soon as one is not.");

static PyObject *chunk_events(PyObject *module, PyObject *payloads)
{
    (void)module;
    if (check_payloads("chunk_events", payloads) < 0)
        return NULL;
    const Py_ssize_t count = PyList_GET_SIZE(payloads);
    PyObject *out = PyList_New(count);
    if (out == NULL)
        return NULL;
    for (Py_ssize_t k = 0; k < count; k++) {
        PyObject *payload = PyList_GET_ITEM(payloads, k);
        PyObject *event = chunk_event((const unsigned char *)PyBytes_AS_STRING(payload), PyBytes_GET_SIZE(payload));
        if (event == NULL) {
            Py_DECREF(out); /* the items not yet set are NULL, which list dealloc skips */
            if (PyErr_Occurred())
                return NULL;
            Py_RETURN_NONE;
        }
        PyList_SET_ITEM(out, k, event);
    }
    return out;
}

/* ``chunk_batch``: a whole read of chunk payloads straight to what the gateway forwards, with no object per
 * event: the events as one JSON array (for the partial decode), their canonical SSE frames, and their
 * names. Each event must begin ``{"type":"<name>"`` (name: 1-64 of [a-z_]) and hold no CR or LF, the
 * shape Bedrock sends; anything else is None, and the caller takes the general path. */
#define TYPE_HEAD "{\"type\":\"" /* 9 bytes */
#define TYPE_HEAD_LENGTH (sizeof TYPE_HEAD - 1)
#define MAX_NAME_LENGTH 64

static PyStructSequence_Field chunk_batch_fields[] = {
    {"array", "the events as one JSON array [e1,e2,...]"},
    {"sse", "the events as canonical SSE, event: <name>\\ndata: <event>\\n\\n each"},
    {"names", "their names, joined by \\n"},
    {"last_at", "the offset of the last event in the array"},
    {"last_frame_at", "the offset of the last event's frame in the SSE"},
    {NULL, NULL},
};

static PyStructSequence_Desc chunk_batch_desc = {
    "adapters._eventstream_c.ChunkBatch", "What chunk_batch() answers: a read of chunk payloads, as forwarded.",
    chunk_batch_fields, 5,
};

PyDoc_STRVAR(chunk_batch_doc,
"chunk_batch(payloads, /) -> ChunkBatch(array, sse, names, last_at, last_frame_at) | None\n\n"
"For chunk payloads that ``chunk_events`` decodes, when every event begins ``{\"type\":\"<name>\"`` (name of\n"
"1-64 characters of a-z and _) and holds no CR or LF: the events as one JSON array ``[e1,e2,...]``, as\n"
"canonical SSE (``event: <name>\\ndata: <event>\\n\\n`` each), their names joined by ``\\n``, the offset of\n"
"the last event in the array and of its frame in the SSE. None otherwise (and for an empty list).");

/* One event of a batch: where its base64 is (found once, by ``locate_events``), its offset in the array and
 * length, and its name's length. */
typedef struct {
    const unsigned char *digits;
    Py_ssize_t length, pads, at, size, name;
} BatchEvent;

/* A batch being built: its events, and the three bytes objects of the result with their sizes. */
typedef struct {
    Py_ssize_t count;
    BatchEvent *events;                /* ``count`` of them (PyMem) */
    Py_ssize_t array_size, names_size; /* the array's length; the names' total length, without separators */
    PyObject *array, *sse, *names;     /* owned */
    Py_ssize_t last_frame_at;          /* the offset of the last event's frame in the SSE */
} ChunkBatchWork;

/* Each payload's base64 and the place of its event in the array: 1; 0 when one is not of the shape. */
static int locate_events(ChunkBatchWork *b, PyObject *payloads)
{
    b->array_size = 1; /* '[' */
    for (Py_ssize_t k = 0; k < b->count; k++) {
        PyObject *payload = PyList_GET_ITEM(payloads, k);
        BatchEvent *event = &b->events[k];
        const Py_ssize_t n = chunk_shape((const unsigned char *)PyBytes_AS_STRING(payload), PyBytes_GET_SIZE(payload),
                                         &event->digits, &event->length, &event->pads);
        if (n < 0)
            return 0;
        event->at = b->array_size;
        event->size = n;
        b->array_size += n + 1; /* the event and ',' (or ']') */
    }
    return 1;
}

/* The length of the name of the ``n`` bytes ``event`` (``{"type":"<name>"``, on one line); -1 when it is not of
 * the shape. */
static Py_ssize_t event_name_length(const unsigned char *event, Py_ssize_t n)
{
    if (n < (Py_ssize_t)TYPE_HEAD_LENGTH + 2 || memcmp(event, TYPE_HEAD, TYPE_HEAD_LENGTH) != 0 ||
        memchr(event, '\n', (size_t)n) != NULL || memchr(event, '\r', (size_t)n) != NULL)
        return -1;
    Py_ssize_t m = 0;
    const unsigned char *name = event + TYPE_HEAD_LENGTH;
    while (m < n - (Py_ssize_t)TYPE_HEAD_LENGTH && m <= MAX_NAME_LENGTH &&
           ((name[m] >= 'a' && name[m] <= 'z') || name[m] == '_'))
        m++;
    if (m == 0 || m > MAX_NAME_LENGTH || m >= n - (Py_ssize_t)TYPE_HEAD_LENGTH || name[m] != '"')
        return -1;
    return m;
}

/* The array: every event decoded into its place, and its name checked. 1; 0 when one is not of the shape;
 * -1 on error. */
static int decode_events(ChunkBatchWork *b)
{
    if ((b->array = PyBytes_FromStringAndSize(NULL, b->array_size)) == NULL)
        return -1;
    unsigned char *a = (unsigned char *)PyBytes_AS_STRING(b->array);
    a[0] = '[';
    b->names_size = 0;
    for (Py_ssize_t k = 0; k < b->count; k++) {
        BatchEvent *e = &b->events[k];
        unsigned char *event = a + e->at;
        if (b64_decode(e->digits, e->length, e->pads, event) < 0)
            return 0;
        event[e->size] = k + 1 < b->count ? ',' : ']';
        if ((e->name = event_name_length(event, e->size)) < 0)
            return 0;
        b->names_size += e->name;
    }
    return 1;
}

/* The SSE of every event (``event: <name>\ndata: <event>\n\n``) and the names joined by "\n". 0; -1 on error. */
static int write_frames(ChunkBatchWork *b)
{
    const Py_ssize_t sse_size = (b->array_size - 1 - b->count) + b->names_size + 16 * b->count;
    if ((b->sse = PyBytes_FromStringAndSize(NULL, sse_size)) == NULL ||
        (b->names = PyBytes_FromStringAndSize(NULL, b->names_size + b->count - 1)) == NULL)
        return -1;
    const unsigned char *a = (const unsigned char *)PyBytes_AS_STRING(b->array);
    unsigned char *sse = (unsigned char *)PyBytes_AS_STRING(b->sse), *o = sse;
    unsigned char *j = (unsigned char *)PyBytes_AS_STRING(b->names);
    for (Py_ssize_t k = 0; k < b->count; k++) {
        const unsigned char *event = a + b->events[k].at, *name = event + TYPE_HEAD_LENGTH;
        const Py_ssize_t n = b->events[k].size, m = b->events[k].name;
        b->last_frame_at = o - sse;
        memcpy(o, "event: ", 7);
        memcpy(o + 7, name, (size_t)m);
        memcpy(o + 7 + m, "\ndata: ", 7);
        memcpy(o + 14 + m, event, (size_t)n);
        memcpy(o + 14 + m + n, "\n\n", 2);
        o += 16 + m + n;
        if (k)
            *j++ = '\n';
        memcpy(j, name, (size_t)m);
        j += m;
    }
    return 0;
}

static PyObject *chunk_batch(PyObject *module, PyObject *payloads)
{
    if (check_payloads("chunk_batch", payloads) < 0)
        return NULL;
    ChunkBatchWork b = {.count = PyList_GET_SIZE(payloads)};
    if (b.count == 0)
        Py_RETURN_NONE;
    if ((b.events = PyMem_Malloc(sizeof *b.events * (size_t)b.count)) == NULL)
        return PyErr_NoMemory();
    PyObject *result = NULL;
    int rc = locate_events(&b, payloads);
    if (rc > 0)
        rc = decode_events(&b);
    if (rc > 0 && write_frames(&b) == 0) {
        PyObject *items[] = {b.array, b.sse, b.names, PyLong_FromSsize_t(b.events[b.count - 1].at),
                             PyLong_FromSsize_t(b.last_frame_at)};
        b.array = b.sse = b.names = NULL; /* the result's now */
        result = structseq_of(module_state(module)->ChunkBatch, items, 5);
    }
    else if (rc == 0) /* not of the shape: the caller takes the general path */
        result = Py_NewRef(Py_None);
    PyMem_Free(b.events);
    Py_XDECREF(b.array);
    Py_XDECREF(b.sse);
    Py_XDECREF(b.names);
    return result;
}

/* ``encode_chunks``: Anthropic events as the ``chunk`` messages a Bedrock InvokeModelWithResponseStream
 * client reads, the inverse of ``chunk_events``: headers ``:event-type`` chunk, ``:content-type``
 * application/json, ``:message-type`` event (all strings, in this order: CHUNK_HEADERS of
 * adapters/_eventstream.py) and payload ``{"bytes":"<standard base64, '=' padded>"}``, real CRCs. The same
 * bytes as ``encode_chunks_py``, into one bytes object sized first.
 *
 * The header block: each header its name length, name, type 7 (string), u16 value length, value (the strings
 * split because "\x05c" would be one escape). */
#define CHUNK_HEADER_BLOCK                                                                                    \
    "\x0b" ":event-type" "\x07\x00\x05" "chunk"                                                               \
    "\x0d" ":content-type" "\x07\x00\x10" "application/json"                                                  \
    "\x0d" ":message-type" "\x07\x00\x05" "event"
#define CHUNK_HEADER_BLOCK_LENGTH (sizeof CHUNK_HEADER_BLOCK - 1) /* 75 */
#define CHUNK_CLOSE "\"}"
#define CHUNK_CLOSE_LENGTH (sizeof CHUNK_CLOSE - 1)
#define CHUNK_OVERHEAD (MIN_LENGTH + CHUNK_HEADER_BLOCK_LENGTH + CHUNK_HEAD_LENGTH + CHUNK_CLOSE_LENGTH) /* 103 */
_Static_assert(CHUNK_HEADER_BLOCK_LENGTH == 75, "the chunk header block is 75 bytes");

/* The length of the base64 of ``n`` bytes ('=' padded). */
static inline size_t b64_length(size_t n) { return n / 3 * 4 + (n % 3 ? 4 : 0); }

/* ``n`` bytes at ``s`` as standard base64 ('=' padded) at ``o``; the end of what it wrote. */
static unsigned char *b64_encode(const unsigned char *s, size_t n, unsigned char *o)
{
    const unsigned char *end = s + n / 3 * 3;
    for (; s < end; s += 3, o += 4) {
        const uint32_t v = ((uint32_t)s[0] << 16) | ((uint32_t)s[1] << 8) | s[2];
        o[0] = (unsigned char)b64_digits[v >> 18];
        o[1] = (unsigned char)b64_digits[(v >> 12) & 63];
        o[2] = (unsigned char)b64_digits[(v >> 6) & 63];
        o[3] = (unsigned char)b64_digits[v & 63];
    }
    switch (n % 3) {
    case 1:
        o[0] = (unsigned char)b64_digits[s[0] >> 2];
        o[1] = (unsigned char)b64_digits[(s[0] & 0x03) << 4];
        o[2] = o[3] = '=';
        o += 4;
        break;
    case 2:
        o[0] = (unsigned char)b64_digits[s[0] >> 2];
        o[1] = (unsigned char)b64_digits[((s[0] & 0x03) << 4) | (s[1] >> 4)];
        o[2] = (unsigned char)b64_digits[(s[1] & 0x0F) << 2];
        o[3] = '=';
        o += 4;
        break;
    }
    return o;
}

static inline void put_be32(unsigned char *p, uint32_t v)
{
    p[0] = (unsigned char)(v >> 24);
    p[1] = (unsigned char)(v >> 16);
    p[2] = (unsigned char)(v >> 8);
    p[3] = (unsigned char)v;
}

/* One chunk message of the ``n`` bytes ``data`` at ``o`` (``total`` bytes long); the end of it. */
static unsigned char *write_chunk(unsigned char *o, uint32_t total, const unsigned char *data, size_t n)
{
    unsigned char *const start = o;
    put_be32(o, total);
    put_be32(o + 4, (uint32_t)CHUNK_HEADER_BLOCK_LENGTH);
    const uint32_t prelude_crc = crc32_update(0, o, 8);
    put_be32(o + 8, prelude_crc);
    o += 12;
    memcpy(o, CHUNK_HEADER_BLOCK, CHUNK_HEADER_BLOCK_LENGTH);
    o += CHUNK_HEADER_BLOCK_LENGTH;
    memcpy(o, CHUNK_HEAD, CHUNK_HEAD_LENGTH);
    o = b64_encode(data, n, o + CHUNK_HEAD_LENGTH);
    memcpy(o, CHUNK_CLOSE, CHUNK_CLOSE_LENGTH);
    o += CHUNK_CLOSE_LENGTH;
    put_be32(o, crc32_update(prelude_crc, start + 8, (size_t)(o - start) - 8));
    return o + 4;
}

PyDoc_STRVAR(encode_chunks_doc,
"encode_chunks(datas, /) -> bytes\n\n"
"Every event of the list (bytes) as one event-stream ``chunk`` message, concatenated: headers\n"
"``:event-type`` chunk, ``:content-type`` application/json, ``:message-type`` event (strings, in this\n"
"order), payload ``{\"bytes\":\"<base64 of the event>\"}``, both CRC-32s. ``adapters._eventstream.encode_chunks_py``\n"
"in C: the same bytes.");

static PyObject *encode_chunks(PyObject *module, PyObject *datas)
{
    (void)module;
    if (check_payloads("encode_chunks", datas) < 0)
        return NULL;
    const Py_ssize_t count = PyList_GET_SIZE(datas);
    size_t size = 0;
    for (Py_ssize_t k = 0; k < count; k++) { /* no Python code runs from here on: the list cannot change */
        const size_t n = (size_t)PyBytes_GET_SIZE(PyList_GET_ITEM(datas, k));
        const size_t total = b64_length(n) + CHUNK_OVERHEAD; /* n < PY_SSIZE_T_MAX: no overflow */
        if (total > UINT32_MAX) {
            PyErr_Format(PyExc_OverflowError, "encode_chunks(): event %zd of %zu bytes is too long for a message", k,
                         n);
            return NULL;
        }
        size += total;
        if (size > (size_t)PY_SSIZE_T_MAX)
            return PyErr_NoMemory();
    }
    PyObject *out = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)size);
    if (out == NULL)
        return NULL;
    unsigned char *o = (unsigned char *)PyBytes_AS_STRING(out);
    for (Py_ssize_t k = 0; k < count; k++) {
        PyObject *data = PyList_GET_ITEM(datas, k);
        const size_t n = (size_t)PyBytes_GET_SIZE(data);
        o = write_chunk(o, (uint32_t)(b64_length(n) + CHUNK_OVERHEAD), (const unsigned char *)PyBytes_AS_STRING(data),
                        n);
    }
    return out;
}

static PyMethodDef methods[] = {
    {"scan", (PyCFunction)(void (*)(void))scan, METH_FASTCALL, scan_doc},
    {"crc32", (PyCFunction)(void (*)(void))crc32_py, METH_FASTCALL, crc32_doc},
    {"_crc32_table", (PyCFunction)(void (*)(void))crc32_table_py, METH_FASTCALL, crc32_table_doc},
    {"chunk_events", (PyCFunction)chunk_events, METH_O, chunk_events_doc},
    {"chunk_batch", (PyCFunction)chunk_batch, METH_O, chunk_batch_doc},
    {"encode_chunks", (PyCFunction)encode_chunks, METH_O, encode_chunks_doc},
    {NULL, NULL, 0, NULL},
};

static int exec_module(PyObject *module)
{
    crc_init();
    b64_init();
    if (PyModule_AddIntConstant(module, "MAX_HEADERS_LENGTH", MAX_HEADERS_LENGTH) < 0 ||
        PyModule_AddIntConstant(module, "MAX_PAYLOAD_LENGTH", MAX_PAYLOAD_LENGTH) < 0 ||
        PyModule_AddStringConstant(module, "CRC", CRC_NAME) < 0)
        return -1;
    ModuleState *state = module_state(module);
    if ((state->ScanResult = PyStructSequence_NewType(&scan_result_desc)) == NULL ||
        (state->ChunkBatch = PyStructSequence_NewType(&chunk_batch_desc)) == NULL)
        return -1;
    if (PyModule_AddType(module, state->ScanResult) < 0 || PyModule_AddType(module, state->ChunkBatch) < 0)
        return -1;
    return 0;
}

static int module_traverse(PyObject *module, visitproc visit, void *arg)
{
    ModuleState *state = module_state(module);
    Py_VISIT(state->ScanResult);
    Py_VISIT(state->ChunkBatch);
    return 0;
}

static int module_clear(PyObject *module)
{
    ModuleState *state = module_state(module);
    Py_CLEAR(state->ScanResult);
    Py_CLEAR(state->ChunkBatch);
    return 0;
}

static void module_free(void *module) { module_clear((PyObject *)module); }

static PyModuleDef_Slot slots[] = {
    {Py_mod_exec, exec_module},
    {0, NULL},
};

static struct PyModuleDef moduledef = {
    PyModuleDef_HEAD_INIT,
    .m_name = "adapters._eventstream_c",
    .m_doc = "The event-stream frame loop of adapters._eventstream and Bedrock chunk decoding and encoding, compiled.",
    .m_size = sizeof(ModuleState),
    .m_methods = methods,
    .m_slots = slots,
    .m_traverse = module_traverse,
    .m_clear = module_clear,
    .m_free = module_free,
};

PyMODINIT_FUNC PyInit__eventstream_c(void)
{
    return PyModuleDef_Init(&moduledef);
}
