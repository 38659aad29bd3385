/* The frame loop of adapters/_eventstream.py in C: ``scan`` walks the AWS event-stream messages of one
 * buffer, checks both CRC-32s and the limits, and returns what ``_scan_py`` (its pure-Python twin, the
 * fallback when this module is not built) returns, byte for byte and message for message. And
 * ``chunk_events``: the base64-decoded events of InvokeModelWithResponseStream chunk payloads of Bedrock's
 * exact shape (adapters/_bedrock_stream.py falls back to msgspec for any other).
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

PyDoc_STRVAR(scan_doc,
"scan(buf, known, /) -> (payloads, frames, offset, error)\n\n"
"The complete messages of ``buf`` from its start: the payloads of the leading run of messages whose\n"
"header block equals ``known`` (bytes, or None for no such run), then every message from the first\n"
"other one on as ``(header bytes, payload)``; the offset of the first byte not consumed; and None, or\n"
"the message of the damage that stopped the walk (the frames before it are intact).");

static PyObject *scan(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "scan() takes exactly 2 arguments");
        return NULL;
    }
    PyObject *bufobj = args[0], *known = args[1];
    if (!PyBytes_Check(bufobj)) {
        PyErr_Format(PyExc_TypeError, "scan() argument 1 must be bytes, not %.100s", Py_TYPE(bufobj)->tp_name);
        return NULL;
    }
    if (known != Py_None && !PyBytes_Check(known)) {
        PyErr_Format(PyExc_TypeError, "scan() argument 2 must be bytes or None, not %.100s",
                     Py_TYPE(known)->tp_name);
        return NULL;
    }
    const unsigned char *buf = (const unsigned char *)PyBytes_AS_STRING(bufobj);
    const Py_ssize_t size = PyBytes_GET_SIZE(bufobj);
    int in_run = known != Py_None;
    const char *known_data = in_run ? PyBytes_AS_STRING(known) : NULL;
    const Py_ssize_t known_length = in_run ? PyBytes_GET_SIZE(known) : -1;

    PyObject *payloads = PyList_New(0);
    PyObject *frames = PyList_New(0);
    PyObject *last_headers = NULL; /* borrowed from ``frames``: equal header blocks share one object */
    PyObject *error = NULL;
    if (payloads == NULL || frames == NULL)
        goto fail;

    Py_ssize_t start = 0;
    while (size - start >= MIN_LENGTH) {
        const unsigned char *p = buf + start;
        const uint32_t total = be32(p), headers_length = be32(p + 4), prelude_crc = be32(p + 8);
        uint32_t crc = crc32_update(0, p, 8);
        if (crc != prelude_crc) {
            error = PyUnicode_FromString("event-stream prelude CRC mismatch");
            break;
        }
        if ((uint64_t)(size - start) < (uint64_t)total) {
            if (headers_length > MAX_HEADERS_LENGTH ||
                (int64_t)total - (int64_t)headers_length - MIN_LENGTH > MAX_PAYLOAD_LENGTH) {
                error = PyUnicode_FromFormat("event-stream message of %lu bytes exceeds the limits",
                                             (unsigned long)total);
            }
            break;
        }
        if ((uint64_t)total < (uint64_t)headers_length + MIN_LENGTH) {
            error = PyUnicode_FromString("event-stream message shorter than its own headers");
            break;
        }
        crc = crc32_update(crc, p + 8, (size_t)total - 12);
        if (crc != be32(p + total - 4)) {
            error = PyUnicode_FromString("event-stream message CRC mismatch");
            break;
        }
        const char *headers = (const char *)p + 12;
        PyObject *payload = PyBytes_FromStringAndSize(headers + headers_length,
                                                      (Py_ssize_t)total - MIN_LENGTH - (Py_ssize_t)headers_length);
        if (payload == NULL)
            goto fail;
        if (in_run && (Py_ssize_t)headers_length == known_length &&
            memcmp(headers, known_data, headers_length) == 0) {
            int rc = PyList_Append(payloads, payload);
            Py_DECREF(payload);
            if (rc < 0)
                goto fail;
        }
        else {
            in_run = 0;
            PyObject *raw;
            if (last_headers != NULL && PyBytes_GET_SIZE(last_headers) == (Py_ssize_t)headers_length &&
                memcmp(PyBytes_AS_STRING(last_headers), headers, headers_length) == 0) {
                raw = Py_NewRef(last_headers);
            }
            else if ((raw = PyBytes_FromStringAndSize(headers, headers_length)) == NULL) {
                Py_DECREF(payload);
                goto fail;
            }
            PyObject *frame = PyTuple_New(2);
            if (frame == NULL) {
                Py_DECREF(raw);
                Py_DECREF(payload);
                goto fail;
            }
            PyTuple_SET_ITEM(frame, 0, raw); /* steals both */
            PyTuple_SET_ITEM(frame, 1, payload);
            int rc = PyList_Append(frames, frame);
            Py_DECREF(frame);
            if (rc < 0)
                goto fail;
            last_headers = raw; /* kept alive by ``frames`` */
        }
        start += total;
    }
    if (error == NULL) {
        if (PyErr_Occurred())
            goto fail;
        error = Py_NewRef(Py_None);
    }
    return Py_BuildValue("(NNnN)", payloads, frames, start, error);

fail:
    Py_XDECREF(payloads);
    Py_XDECREF(frames);
    Py_XDECREF(error);
    return NULL;
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

static void b64_init(void)
{
    static const char digits[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    memset(b64_values, 0xFF, sizeof b64_values);
    for (int i = 0; i < 64; i++)
        b64_values[(unsigned char)digits[i]] = (unsigned char)i;
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

PyDoc_STRVAR(chunk_batch_doc,
"chunk_batch(payloads, /) -> (array, sse, names, last_at, last_frame_at) | None\n\n"
"For chunk payloads that ``chunk_events`` decodes, when every event begins ``{\"type\":\"<name>\"`` (name of\n"
"1-64 characters of a-z and _) and holds no CR or LF: the events as one JSON array ``[e1,e2,...]``, as\n"
"canonical SSE (``event: <name>\\ndata: <event>\\n\\n`` each), their names joined by ``\\n``, the offset of\n"
"the last event in the array and of its frame in the SSE. None otherwise (and for an empty list).");

static PyObject *chunk_batch(PyObject *module, PyObject *payloads)
{
    (void)module;
    if (check_payloads("chunk_batch", payloads) < 0)
        return NULL;
    const Py_ssize_t count = PyList_GET_SIZE(payloads);
    if (count == 0)
        Py_RETURN_NONE;
    /* per event: where its base64 is (found once, by the first pass), its offset in the array and length,
     * and its name's length */
    struct {
        const unsigned char *digits;
        Py_ssize_t length, pads, at, size, name;
    } *events = PyMem_Malloc(sizeof *events * (size_t)count);
    if (events == NULL)
        return PyErr_NoMemory();
    PyObject *array = NULL, *sse = NULL, *joined = NULL, *result = NULL;

    Py_ssize_t total = 1; /* '[' */
    for (Py_ssize_t k = 0; k < count; k++) {
        PyObject *payload = PyList_GET_ITEM(payloads, k);
        const Py_ssize_t n = chunk_shape((const unsigned char *)PyBytes_AS_STRING(payload),
                                         PyBytes_GET_SIZE(payload), &events[k].digits, &events[k].length,
                                         &events[k].pads);
        if (n < 0)
            goto none;
        events[k].at = total;
        events[k].size = n;
        total += n + 1; /* the event and ',' (or ']') */
    }
    if ((array = PyBytes_FromStringAndSize(NULL, total)) == NULL)
        goto done;
    unsigned char *a = (unsigned char *)PyBytes_AS_STRING(array);
    a[0] = '[';
    Py_ssize_t names_total = 0;
    for (Py_ssize_t k = 0; k < count; k++) {
        unsigned char *event = a + events[k].at;
        const Py_ssize_t n = events[k].size;
        if (b64_decode(events[k].digits, events[k].length, events[k].pads, event) < 0)
            goto none;
        event[n] = k + 1 < count ? ',' : ']';
        if (n < (Py_ssize_t)TYPE_HEAD_LENGTH + 2 || memcmp(event, TYPE_HEAD, TYPE_HEAD_LENGTH) != 0 ||
            memchr(event, '\n', (size_t)n) != NULL || memchr(event, '\r', (size_t)n) != NULL)
            goto none;
        Py_ssize_t m = 0;
        const unsigned char *name = event + TYPE_HEAD_LENGTH;
        while (m < n - (Py_ssize_t)TYPE_HEAD_LENGTH && m <= MAX_NAME_LENGTH &&
               ((name[m] >= 'a' && name[m] <= 'z') || name[m] == '_'))
            m++;
        if (m == 0 || m > MAX_NAME_LENGTH || m >= n - (Py_ssize_t)TYPE_HEAD_LENGTH || name[m] != '"')
            goto none;
        events[k].name = m;
        names_total += m;
    }
    /* "event: " name "\ndata: " event "\n\n" */
    const Py_ssize_t sse_total = (total - 1 - count) + names_total + 16 * count;
    if ((sse = PyBytes_FromStringAndSize(NULL, sse_total)) == NULL ||
        (joined = PyBytes_FromStringAndSize(NULL, names_total + count - 1)) == NULL)
        goto done;
    unsigned char *o = (unsigned char *)PyBytes_AS_STRING(sse), *j = (unsigned char *)PyBytes_AS_STRING(joined);
    Py_ssize_t last_frame_at = 0;
    for (Py_ssize_t k = 0; k < count; k++) {
        const unsigned char *event = a + events[k].at;
        const Py_ssize_t n = events[k].size, m = events[k].name;
        last_frame_at = o - (unsigned char *)PyBytes_AS_STRING(sse);
        memcpy(o, "event: ", 7);
        memcpy(o + 7, event + TYPE_HEAD_LENGTH, (size_t)m);
        memcpy(o + 7 + m, "\ndata: ", 7);
        memcpy(o + 14 + m, event, (size_t)n);
        memcpy(o + 14 + m + n, "\n\n", 2);
        o += 16 + m + n;
        if (k)
            *j++ = '\n';
        memcpy(j, event + TYPE_HEAD_LENGTH, (size_t)m);
        j += m;
    }
    result = Py_BuildValue("(OOOnn)", array, sse, joined, events[count - 1].at, last_frame_at);
    goto done;

none:
    result = Py_NewRef(Py_None);
done:
    PyMem_Free(events);
    Py_XDECREF(array);
    Py_XDECREF(sse);
    Py_XDECREF(joined);
    return result;
}

static PyMethodDef methods[] = {
    {"scan", (PyCFunction)(void (*)(void))scan, METH_FASTCALL, scan_doc},
    {"crc32", (PyCFunction)(void (*)(void))crc32_py, METH_FASTCALL, crc32_doc},
    {"_crc32_table", (PyCFunction)(void (*)(void))crc32_table_py, METH_FASTCALL, crc32_table_doc},
    {"chunk_events", (PyCFunction)chunk_events, METH_O, chunk_events_doc},
    {"chunk_batch", (PyCFunction)chunk_batch, METH_O, chunk_batch_doc},
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
    return 0;
}

static PyModuleDef_Slot slots[] = {
    {Py_mod_exec, exec_module},
    {0, NULL},
};

static struct PyModuleDef moduledef = {
    PyModuleDef_HEAD_INIT,
    .m_name = "adapters._eventstream_c",
    .m_doc = "The event-stream frame loop of adapters._eventstream and Bedrock chunk decoding, compiled.",
    .m_size = 0,
    .m_methods = methods,
    .m_slots = slots,
};

PyMODINIT_FUNC PyInit__eventstream_c(void)
{
    return PyModuleDef_Init(&moduledef);
}
