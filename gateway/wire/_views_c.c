/* The partial decode of a batch's events (gateway/wire/events.py ``decode_views``), for its commonest event;
 * and ``split_sse``, gateway/wire/sse.py's ``split_canonical`` (a block of canonical SSE frames as its event
 * lines and one JSON array of its data) without a Python object per line.
 *
 * Nearly every event of a stream is a delta of one shape, ``{"type":"content_block_delta","index":N,
 * "delta":{"type":"<t>","<key>":"<string>"}}``, and its partial view depends on N and <t> only. ``scan_views``
 * walks a JSON array of events, recognises those deltas strictly (the string's bytes are checked: printable
 * ASCII, valid UTF-8, simple escapes; anything else is not "of the shape") and answers each with the view
 * cached for its prefix; every other event (and a delta whose prefix is not cached yet) is handed back, its
 * exact bytes in a second JSON array, for msgspec to decode. The caller then caches the views of the deltas
 * msgspec decoded. So an event either gets msgspec's own answer or the answer msgspec gave for an event with
 * the same prefix, which is the same view.
 *
 * Optional: setup.py builds it when a C compiler is there; events.py uses msgspec alone without it.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <string.h>

#define DELTA_HEAD "{\"type\":\"content_block_delta\",\"index\":"
#define DELTA_HEAD_LENGTH (sizeof DELTA_HEAD - 1)
#define DELTA_MID ",\"delta\":{\"type\":\""
#define DELTA_MID_LENGTH (sizeof DELTA_MID - 1)
#define MAX_NAME 64
#define MAX_DEPTH 64

static int is_name(unsigned char c) { return (c >= 'a' && c <= 'z') || c == '_'; }

/* The closing quote of a JSON string whose content starts at ``p``, if the content is strictly valid:
 * no control character, valid UTF-8 (no overlong form, no surrogate), escapes only \" \\ \/ \b \f \n \r \t.
 * NULL otherwise (the event is then left to msgspec, which may well accept it). */
static const unsigned char *strict_string(const unsigned char *p, const unsigned char *end)
{
    while (p < end) {
        const unsigned c = *p;
        if (c == '"')
            return p;
        if (c == '\\') {
            if (end - p < 2)
                return NULL;
            switch (p[1]) {
            case '"': case '\\': case '/': case 'b': case 'f': case 'n': case 'r': case 't':
                p += 2;
                continue;
            default:
                return NULL;
            }
        }
        if (c < 0x20)
            return NULL;
        if (c < 0x80) {
            p++;
            continue;
        }
        const Py_ssize_t left = end - p;
        if (c >= 0xC2 && c <= 0xDF) {
            if (left < 2 || (p[1] & 0xC0) != 0x80)
                return NULL;
            p += 2;
        }
        else if (c >= 0xE0 && c <= 0xEF) {
            if (left < 3 || (p[1] & 0xC0) != 0x80 || (p[2] & 0xC0) != 0x80 || (c == 0xE0 && p[1] < 0xA0) ||
                (c == 0xED && p[1] > 0x9F))
                return NULL;
            p += 3;
        }
        else if (c >= 0xF0 && c <= 0xF4) {
            if (left < 4 || (p[1] & 0xC0) != 0x80 || (p[2] & 0xC0) != 0x80 || (p[3] & 0xC0) != 0x80 ||
                (c == 0xF0 && p[1] < 0x90) || (c == 0xF4 && p[1] > 0x8F))
                return NULL;
            p += 4;
        }
        else
            return NULL;
    }
    return NULL;
}

/* A delta of the shape at ``p``: the end of the event (just after its "}}"), with ``*key_end`` the end of
 * its prefix (just after the comma that follows the delta's type); NULL when the event is not one. */
static const unsigned char *delta_event(const unsigned char *p, const unsigned char *end,
                                        const unsigned char **key_end)
{
    const unsigned char *q = p;
    if ((size_t)(end - q) < DELTA_HEAD_LENGTH || memcmp(q, DELTA_HEAD, DELTA_HEAD_LENGTH) != 0)
        return NULL;
    q += DELTA_HEAD_LENGTH;
    if (q < end && *q == '0')
        q++;
    else if (q < end && *q >= '1' && *q <= '9') {
        const unsigned char *digits = q;
        while (q < end && *q >= '0' && *q <= '9')
            q++;
        if (q - digits > 9) /* an int of any size is msgspec's to judge */
            return NULL;
    }
    else
        return NULL;
    if ((size_t)(end - q) < DELTA_MID_LENGTH || memcmp(q, DELTA_MID, DELTA_MID_LENGTH) != 0)
        return NULL;
    q += DELTA_MID_LENGTH;
    const unsigned char *name = q;
    while (q < end && q - name <= MAX_NAME && is_name(*q))
        q++;
    if (q == name || q - name > MAX_NAME || end - q < 3 || q[0] != '"' || q[1] != ',' || q[2] != '"')
        return NULL;
    *key_end = q + 2;
    q += 3;
    const unsigned char *key = q;
    while (q < end && q - key <= MAX_NAME && is_name(*q))
        q++;
    if (q == key || q - key > MAX_NAME || end - q < 3 || q[0] != '"' || q[1] != ':' || q[2] != '"')
        return NULL;
    if (q - key == 4 && memcmp(key, "type", 4) == 0) /* a second "type": msgspec decides which counts */
        return NULL;
    q = strict_string(q + 3, end);
    if (q == NULL || end - q < 3 || q[1] != '}' || q[2] != '}')
        return NULL;
    return q + 3;
}

/* The end of the object or array at ``p``, brackets matched and strings skipped (not validated: msgspec
 * decodes these bytes); NULL when unbalanced, nested too deep or not an object or array. */
static const unsigned char *skip_value(const unsigned char *p, const unsigned char *end)
{
    unsigned char closers[MAX_DEPTH];
    int depth = 0;
    if (p >= end || (*p != '{' && *p != '['))
        return NULL;
    while (p < end) {
        const unsigned c = *p++;
        if (c == '"') {
            for (;;) {
                if (p >= end)
                    return NULL;
                const unsigned s = *p++;
                if (s == '"')
                    break;
                if (s == '\\') {
                    if (p >= end)
                        return NULL;
                    p++;
                }
            }
        }
        else if (c == '{' || c == '[') {
            if (depth == MAX_DEPTH)
                return NULL;
            closers[depth++] = c == '{' ? '}' : ']';
        }
        else if (c == '}' || c == ']') {
            if (depth == 0 || closers[depth - 1] != c)
                return NULL;
            if (--depth == 0)
                return p;
        }
    }
    return NULL;
}

/* The named results, PyStructSequence types (tuples with named fields, like os.stat_result): created by the
 * exec slot into the module's state (so each module object, and each interpreter, has its own) and exposed as
 * module attributes. */
typedef struct {
    PyTypeObject *ScannedViews, *SplitSse;
    PyObject *type_name;      /* "type", interned: the attribute ``names_match`` reads */
    PyTypeObject *view_class; /* the class whose ``type`` is read at ``type_offset`` (its slot); NULL: none yet */
    Py_ssize_t type_offset;   /* -1: that class's ``type`` is no plain slot (getattr) */
} ModuleState;

static ModuleState *module_state(PyObject *module) { return (ModuleState *)PyModule_GetState(module); }

static PyStructSequence_Field scanned_views_fields[] = {
    {"views", "one item per event: the cached view of a delta of the common shape, else None"},
    {"rest", "the events answered None, as one JSON array; None when there are none"},
    {"misses", "(position, prefix) for each of those, in order; prefix None for an event not of the shape"},
    {NULL, NULL},
};

static PyStructSequence_Desc scanned_views_desc = {
    "gateway.wire._views_c.ScannedViews", "What scan_views() answers: the cached views and the events left over.",
    scanned_views_fields, 3,
};

static PyStructSequence_Field split_sse_fields[] = {
    {"events", "the event lines, joined by \\n"},
    {"array", "the data of every frame as one JSON array"},
    {"frame_count", "the number of frames"},
    {NULL, NULL},
};

static PyStructSequence_Desc split_sse_desc = {
    "gateway.wire._views_c.SplitSse", "What split_sse() answers: a block of canonical SSE frames split.",
    split_sse_fields, 3,
};

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

PyDoc_STRVAR(scan_views_doc,
"scan_views(array, cache, /) -> ScannedViews(views, rest, misses) | None\n\n"
"``array``: a JSON array of events, no whitespace between them. ``views``: one item per event, the view\n"
"``cache`` holds for a delta of the common shape whose prefix (up to and including the comma after its\n"
"delta type) is a key of it, else None. ``rest``: the events answered None, as one JSON array (None when\n"
"there are none). ``misses``: for each of those, in order, ``(position, prefix)``, the prefix being None\n"
"for an event not of the shape. None when the array cannot be split into events this way.");

typedef struct {
    Py_ssize_t start, length;
} Piece;

/* The walk of ``scan_views`` over one array: what it has found so far. */
typedef struct {
    const unsigned char *base;       /* the array's bytes */
    PyObject *cache;                 /* borrowed */
    PyObject *views, *misses;        /* the two lists of the result (owned) */
    Piece *pieces;                   /* where in ``base`` the events answered None are (PyMem) */
    Py_ssize_t count, capacity;      /* pieces used, allocated */
    Py_ssize_t rest_size;            /* the length of their array: '[' and each one with its ',' or ']' */
    const unsigned char *last_key;   /* the prefix last found in the cache, and its view (borrowed) */
    Py_ssize_t last_key_length;
    PyObject *last_view;
} ViewScan;

static void view_scan_clear(ViewScan *s)
{
    Py_XDECREF(s->views);
    Py_XDECREF(s->misses);
    PyMem_Free(s->pieces);
}

/* The cached view of the delta whose prefix is the ``length`` bytes at ``p``, in ``*view`` (borrowed); or
 * ``*view`` left NULL and ``*key`` that prefix (a new reference) when the cache has none. -1 on error. */
static int look_up_view(ViewScan *s, const unsigned char *p, Py_ssize_t length, PyObject **view, PyObject **key)
{
    if (s->last_view != NULL && length == s->last_key_length && memcmp(p, s->last_key, (size_t)length) == 0) {
        *view = s->last_view;
        return 0;
    }
    PyObject *prefix = PyBytes_FromStringAndSize((const char *)p, length);
    if (prefix == NULL)
        return -1;
    PyObject *found = PyDict_GetItemWithError(s->cache, prefix);
    if (found == NULL) {
        if (PyErr_Occurred()) {
            Py_DECREF(prefix);
            return -1;
        }
        *key = prefix;
        return 0;
    }
    Py_DECREF(prefix);
    *view = s->last_view = found;
    s->last_key = p;
    s->last_key_length = length;
    return 0;
}

/* The event [p, e) in the array of the rest. */
static int add_piece(ViewScan *s, const unsigned char *p, const unsigned char *e)
{
    if (s->count == s->capacity) {
        const Py_ssize_t capacity = s->capacity ? 2 * s->capacity : 16;
        Piece *grown = PyMem_Realloc(s->pieces, sizeof(Piece) * (size_t)capacity);
        if (grown == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        s->pieces = grown;
        s->capacity = capacity;
    }
    s->pieces[s->count].start = p - s->base;
    s->pieces[s->count].length = e - p;
    s->rest_size += e - p + 1;
    s->count++;
    return 0;
}

/* An event the cache does not answer, [p, e): None in the views, ``(position, key)`` in the misses (``key``
 * stolen; NULL stands for None: not of the shape) and its bytes in the rest. */
static int add_miss(ViewScan *s, const unsigned char *p, const unsigned char *e, PyObject *key)
{
    PyObject *miss = Py_BuildValue("(nN)", PyList_GET_SIZE(s->views), key != NULL ? key : Py_NewRef(Py_None));
    if (miss == NULL)
        return -1;
    const int rc = PyList_Append(s->misses, miss);
    Py_DECREF(miss);
    if (rc < 0 || PyList_Append(s->views, Py_None) < 0)
        return -1;
    return add_piece(s, p, e);
}

/* The event at ``p``: its view or its miss recorded, ``*end`` just after it. 1; 0 when no event ends there
 * (not an array this walk can split); -1 on error. */
static int scan_event(ViewScan *s, const unsigned char *p, const unsigned char *stop, const unsigned char **end)
{
    const unsigned char *key_end = NULL, *e = delta_event(p, stop, &key_end);
    PyObject *view = NULL, *key = NULL;
    if (e != NULL) {
        if (look_up_view(s, p, key_end - p, &view, &key) < 0)
            return -1;
    }
    else if ((e = skip_value(p, stop)) == NULL)
        return 0;
    *end = e;
    if (view != NULL)
        return PyList_Append(s->views, view) < 0 ? -1 : 1;
    return add_miss(s, p, e, key) < 0 ? -1 : 1;
}

/* Every event of [p, stop), the inside of the array: 1; 0 when it is not a list of events separated by
 * single commas; -1 on error. */
static int scan_events(ViewScan *s, const unsigned char *p, const unsigned char *stop)
{
    while (p < stop) {
        const int rc = scan_event(s, p, stop, &p);
        if (rc <= 0)
            return rc;
        if (p == stop)
            break;
        if (*p != ',' || p + 1 == stop) /* not a separator, or a trailing one */
            return 0;
        p++;
    }
    return 1;
}

/* The events answered None as one JSON array (a new reference; None when there are none), NULL on error. */
static PyObject *rest_array(const ViewScan *s)
{
    if (s->count == 0)
        return Py_NewRef(Py_None);
    PyObject *rest = PyBytes_FromStringAndSize(NULL, s->rest_size);
    if (rest == NULL)
        return NULL;
    char *o = PyBytes_AS_STRING(rest);
    *o++ = '[';
    for (Py_ssize_t k = 0; k < s->count; k++) {
        memcpy(o, s->base + s->pieces[k].start, (size_t)s->pieces[k].length);
        o += s->pieces[k].length;
        *o++ = k + 1 < s->count ? ',' : ']';
    }
    return rest;
}

/* 0 when the arguments are (bytes, dict); else -1 with a TypeError. */
static int check_scan_views_args(PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "scan_views() takes exactly 2 arguments");
        return -1;
    }
    if (!PyBytes_Check(args[0])) {
        PyErr_Format(PyExc_TypeError, "scan_views() argument 1 must be bytes, not %.100s", Py_TYPE(args[0])->tp_name);
        return -1;
    }
    if (!PyDict_CheckExact(args[1])) {
        PyErr_Format(PyExc_TypeError, "scan_views() argument 2 must be dict, not %.100s", Py_TYPE(args[1])->tp_name);
        return -1;
    }
    return 0;
}

static PyObject *scan_views(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (check_scan_views_args(args, nargs) < 0)
        return NULL;
    const unsigned char *base = (const unsigned char *)PyBytes_AS_STRING(args[0]);
    const Py_ssize_t size = PyBytes_GET_SIZE(args[0]);
    if (size < 2 || base[0] != '[' || base[size - 1] != ']')
        Py_RETURN_NONE;
    ViewScan s = {.base = base, .cache = args[1], .views = PyList_New(0), .misses = PyList_New(0), .rest_size = 1};
    PyObject *result = NULL;
    if (s.views != NULL && s.misses != NULL) {
        const int rc = scan_events(&s, base + 1, base + size - 1);
        if (rc > 0) { /* the result holds the two lists: ``view_scan_clear`` releases the walk's references */
            PyObject *items[] = {Py_NewRef(s.views), rest_array(&s), Py_NewRef(s.misses)};
            result = structseq_of(module_state(module)->ScannedViews, items, 3);
        }
        else if (rc == 0) /* not an array this walk can split: msgspec decodes the whole of it */
            result = Py_NewRef(Py_None);
    }
    view_scan_clear(&s);
    return result;
}

PyDoc_STRVAR(split_sse_doc,
"split_sse(block, /) -> SplitSse(events, array, frame_count) | None\n\n"
"gateway.wire.sse.split_canonical in C: for a block of frames each exactly ``event: <name>``, ``data: <json>``\n"
"and a blank line (nothing after the last), the event lines joined by ``\\n``, the data as one JSON array and\n"
"the frame count; None for any other block.");

/* The sizes of a block's parts: its frame count, the length of its event lines (each with its "\n") and
 * the length of their data as a JSON array. */
typedef struct {
    Py_ssize_t count, events_size, array_size;
} SseSizes;

/* 1 and ``*sizes`` when [start, end) is frames of the canonical shape, else 0. */
static int measure_frames(const char *start, const char *end, SseSizes *sizes)
{
    *sizes = (SseSizes){.array_size = 1};
    for (const char *p = start; p < end;) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        if (nl == NULL || nl - p < 7 || memcmp(p, "event: ", 7) != 0)
            return 0;
        sizes->events_size += nl - p + 1;
        p = nl + 1;
        nl = p < end ? memchr(p, '\n', (size_t)(end - p)) : NULL;
        if (nl == NULL || nl - p < 6 || memcmp(p, "data: ", 6) != 0)
            return 0;
        sizes->array_size += nl - p - 6 + 1;
        p = nl + 1;
        if (p >= end || *p != '\n')
            return 0;
        p++;
        sizes->count++;
    }
    return 1;
}

/* The event lines of [start, end) (frames of the canonical shape) into ``e``, their data into ``a`` as a
 * JSON array. */
static void write_split(const char *start, const char *end, char *e, char *a)
{
    *a++ = '[';
    for (const char *p = start; p < end;) { /* event line, data line, blank line */
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        if (p != start) {
            *e++ = '\n';
            *a++ = ',';
        }
        memcpy(e, p, (size_t)(nl - p));
        e += nl - p;
        p = nl + 1;
        nl = memchr(p, '\n', (size_t)(end - p));
        memcpy(a, p + 6, (size_t)(nl - p - 6));
        a += nl - p - 6;
        p = nl + 2;
    }
    *a = ']';
}

static PyObject *split_sse(PyObject *module, PyObject *block)
{
    if (!PyBytes_Check(block)) {
        PyErr_Format(PyExc_TypeError, "split_sse() argument must be bytes, not %.100s", Py_TYPE(block)->tp_name);
        return NULL;
    }
    const char *start = PyBytes_AS_STRING(block), *end = start + PyBytes_GET_SIZE(block);
    SseSizes sizes;
    if (!measure_frames(start, end, &sizes))
        Py_RETURN_NONE;
    PyObject *events = PyBytes_FromStringAndSize(NULL, sizes.count ? sizes.events_size - 1 : 0);
    PyObject *array = PyBytes_FromStringAndSize(NULL, sizes.count ? sizes.array_size : 2);
    if (events == NULL || array == NULL) {
        Py_XDECREF(events);
        Py_XDECREF(array);
        return NULL;
    }
    write_split(start, end, PyBytes_AS_STRING(events), PyBytes_AS_STRING(array));
    PyObject *items[] = {events, array, PyLong_FromSsize_t(sizes.count)};
    return structseq_of(module_state(module)->SplitSse, items, 3);
}


/* --- top_level_duplicate: a top-level key given twice ------------------------------------------------------
 * The request body is checked by msgspec, which keeps the *last* of two equal keys; a provider may keep the
 * first. So a body with `model` (or `stream`, `max_tokens`) twice could be routed and allowed as one model and
 * served as another. This walks the top-level object only (nested values are skipped, strings honoured) and
 * returns the first of `names` seen twice; None when there is none or the body is not a plain JSON object
 * (msgspec reports those); b"\\" when a top-level key holds an escape (the caller decodes those itself). */

static const char *tl_skip_ws(const char *p, const char *end)
{
    while (p < end && (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r'))
        p++;
    return p;
}

/* p at the opening quote: returns the position after the closing quote, or NULL; *escaped set if a `\` occurs */
static const char *tl_skip_string(const char *p, const char *end, int *escaped)
{
    p++;
    while (p < end) {
        char c = *p;
        if (c == '"')
            return p + 1;
        if (c == '\\') {
            *escaped = 1;
            p += 2;
            continue;
        }
        p++;
    }
    return NULL;
}

/* p at a value: returns the position after it, or NULL (malformed; msgspec will say how) */
static const char *tl_skip_value(const char *p, const char *end)
{
    int escaped = 0;
    if (p >= end)
        return NULL;
    if (*p == '"')
        return tl_skip_string(p, end, &escaped);
    if (*p == '{' || *p == '[') {
        Py_ssize_t depth = 0;
        while (p < end) {
            char c = *p;
            if (c == '"') {
                p = tl_skip_string(p, end, &escaped);
                if (p == NULL)
                    return NULL;
                continue;
            }
            if (c == '{' || c == '[')
                depth++;
            else if (c == '}' || c == ']') {
                depth--;
                if (depth == 0)
                    return p + 1;
            }
            p++;
        }
        return NULL;
    }
    while (p < end && *p != ',' && *p != '}' && *p != ' ' && *p != '\t' && *p != '\n' && *p != '\r')
        p++;
    return p;
}

#define MAX_NAMES 8

static PyObject *top_level_duplicate(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 2 || !PyBytes_Check(args[0]) || !PyTuple_Check(args[1]) || PyTuple_GET_SIZE(args[1]) > MAX_NAMES) {
        PyErr_SetString(PyExc_TypeError, "top_level_duplicate(body: bytes, names: tuple[bytes, ...]) (at most 8)");
        return NULL;
    }
    PyObject *names = args[1];
    Py_ssize_t count = PyTuple_GET_SIZE(names);
    int seen[MAX_NAMES] = {0};
    for (Py_ssize_t i = 0; i < count; i++) {
        if (!PyBytes_Check(PyTuple_GET_ITEM(names, i))) {
            PyErr_SetString(PyExc_TypeError, "names must be bytes");
            return NULL;
        }
    }
    const char *p = PyBytes_AS_STRING(args[0]);
    const char *end = p + PyBytes_GET_SIZE(args[0]);
    p = tl_skip_ws(p, end);
    if (p >= end || *p != '{')
        Py_RETURN_NONE;
    p = tl_skip_ws(p + 1, end);
    if (p < end && *p == '}')
        Py_RETURN_NONE;
    while (p < end) {
        if (*p != '"')
            Py_RETURN_NONE;
        int escaped = 0;
        const char *key = p + 1;
        const char *after = tl_skip_string(p, end, &escaped);
        if (after == NULL)
            Py_RETURN_NONE;
        if (escaped)
            return PyBytes_FromStringAndSize("\\", 1);
        Py_ssize_t length = (after - 1) - key;
        for (Py_ssize_t i = 0; i < count; i++) {
            PyObject *name = PyTuple_GET_ITEM(names, i);
            if (PyBytes_GET_SIZE(name) == length && memcmp(PyBytes_AS_STRING(name), key, (size_t)length) == 0) {
                if (seen[i]++) {
                    Py_INCREF(name);
                    return name;
                }
                break;
            }
        }
        p = tl_skip_ws(after, end);
        if (p >= end || *p != ':')
            Py_RETURN_NONE;
        p = tl_skip_value(tl_skip_ws(p + 1, end), end);
        if (p == NULL)
            Py_RETURN_NONE;
        p = tl_skip_ws(p, end);
        if (p < end && *p == ',') {
            p = tl_skip_ws(p + 1, end);
            continue;
        }
        Py_RETURN_NONE; /* the closing brace (or something msgspec will refuse) */
    }
    Py_RETURN_NONE;
}

PyDoc_STRVAR(top_level_duplicate_doc,
             "top_level_duplicate(body, names) -> the first of names given twice as a top-level key of the JSON "
             "object body, b'\\\\' if a top-level key holds an escape, else None.");

PyDoc_STRVAR(names_match_doc,
"names_match(events, views, /) -> bool\n\n"
"``events == b'event: ' + '\\nevent: '.join([v.type for v in views]).encode()`` (a block's event lines from\n"
"``split_sse``, each its view's type) without the list, the join and the copy: each view's type compared in place.");

/* ``view.type`` (a new reference); NULL with an error. Read in its slot when the view's class keeps it in one. */
static PyObject *view_type(ModuleState *state, PyObject *view)
{
    if (Py_TYPE(view) != state->view_class) {
        PyTypeObject *cls = Py_TYPE(view);
        Py_ssize_t offset = -1;
        /* a member descriptor of an object slot is a data descriptor: no instance __dict__ can hide it */
        PyObject *descriptor = _PyType_Lookup(cls, state->type_name); /* borrowed */
        if (descriptor != NULL && Py_IS_TYPE(descriptor, &PyMemberDescr_Type)) {
            PyMemberDef *member = ((PyMemberDescrObject *)descriptor)->d_member;
            if (member->type == T_OBJECT_EX && !(member->flags & READ_RESTRICTED) && member->offset > 0)
                offset = member->offset;
        }
        Py_XSETREF(state->view_class, (PyTypeObject *)Py_NewRef((PyObject *)cls));
        state->type_offset = offset;
    }
    if (state->type_offset > 0) {
        PyObject *value = *(PyObject **)((char *)view + state->type_offset);
        if (value == NULL)
            PyErr_Format(PyExc_AttributeError, "'%.100s' object has no attribute 'type'", Py_TYPE(view)->tp_name);
        return Py_XNewRef(value);
    }
    return PyObject_GetAttr(view, state->type_name);
}

static PyObject *names_match(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2 || !PyBytes_Check(args[0]) || !PyList_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "names_match() takes a bytes and a list");
        return NULL;
    }
    ModuleState *state = module_state(module);
    const char *p = PyBytes_AS_STRING(args[0]), *end = p + PyBytes_GET_SIZE(args[0]);
    PyObject *views = args[1];
    if (PyList_GET_SIZE(views) == 0)
        return PyBool_FromLong(end - p == 7 && memcmp(p, "event: ", 7) == 0);
    int match = 1;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(views); i++) { /* (the list may change under a getattr) */
        PyObject *view = Py_NewRef(PyList_GET_ITEM(views, i));
        PyObject *value = view_type(state, view);
        Py_DECREF(view);
        if (value == NULL)
            return NULL;
        if (!PyUnicode_Check(value)) { /* what str.join refuses */
            PyErr_Format(PyExc_TypeError, "sequence item %zd: expected str instance, %.80s found", i,
                         Py_TYPE(value)->tp_name);
            Py_DECREF(value);
            return NULL;
        }
        Py_ssize_t size;
        const char *name; /* its UTF-8: an ASCII str's own bytes; else encoded (a lone surrogate: .encode()'s error) */
        if (PyUnicode_IS_COMPACT_ASCII(value)) {
            name = (const char *)PyUnicode_DATA(value);
            size = PyUnicode_GET_LENGTH(value);
        }
        else
            name = PyUnicode_AsUTF8AndSize(value, &size);
        if (name == NULL) {
            Py_DECREF(value);
            return NULL;
        }
        if (match) {
            const Py_ssize_t head = i == 0 ? 7 : 8; /* "event: ", then "\nevent: " */
            if (end - p < head + size || memcmp(p, &"\nevent: "[i == 0], (size_t)head) != 0 ||
                memcmp(p + head, name, (size_t)size) != 0)
                match = 0; /* (the rest still read: an error in a later type is raised, as the join raises it) */
            else
                p += head + size;
        }
        Py_DECREF(value);
    }
    return PyBool_FromLong(match && p == end);
}

PyDoc_STRVAR(is_ascii_doc,
"is_ascii(data, /) -> bool\n\n"
"``data.isascii()`` for bytes, a whole block's bytes OR-ed in one vectorised loop (CPython's goes a word at a time).");

static PyObject *is_ascii(PyObject *module, PyObject *data)
{
    (void)module;
    if (!PyBytes_Check(data)) {
        PyErr_Format(PyExc_TypeError, "is_ascii() argument must be bytes, not %.100s", Py_TYPE(data)->tp_name);
        return NULL;
    }
    const unsigned char *p = (const unsigned char *)PyBytes_AS_STRING(data);
    const Py_ssize_t size = PyBytes_GET_SIZE(data);
    unsigned char any = 0;
    for (Py_ssize_t i = 0; i < size; i++) /* no early exit: a non-ASCII block is rare, the loop vectorises */
        any |= p[i];
    return PyBool_FromLong(any < 0x80);
}

static PyMethodDef methods[] = {
    {"scan_views", (PyCFunction)(void (*)(void))scan_views, METH_FASTCALL, scan_views_doc},
    {"split_sse", (PyCFunction)split_sse, METH_O, split_sse_doc},
    {"names_match", (PyCFunction)(void (*)(void))names_match, METH_FASTCALL, names_match_doc},
    {"is_ascii", (PyCFunction)is_ascii, METH_O, is_ascii_doc},
    {"top_level_duplicate", (PyCFunction)(void (*)(void))top_level_duplicate, METH_FASTCALL, top_level_duplicate_doc},
    {NULL, NULL, 0, NULL},
};

static int exec_module(PyObject *module)
{
    ModuleState *state = module_state(module);
    if ((state->ScannedViews = PyStructSequence_NewType(&scanned_views_desc)) == NULL ||
        (state->SplitSse = PyStructSequence_NewType(&split_sse_desc)) == NULL)
        return -1;
    if (PyModule_AddType(module, state->ScannedViews) < 0 || PyModule_AddType(module, state->SplitSse) < 0)
        return -1;
    if ((state->type_name = PyUnicode_InternFromString("type")) == NULL)
        return -1;
    state->view_class = NULL;
    return 0;
}

static int module_traverse(PyObject *module, visitproc visit, void *arg)
{
    ModuleState *state = module_state(module);
    Py_VISIT(state->ScannedViews);
    Py_VISIT(state->SplitSse);
    Py_VISIT(state->view_class);
    return 0;
}

static int module_clear(PyObject *module)
{
    ModuleState *state = module_state(module);
    Py_CLEAR(state->ScannedViews);
    Py_CLEAR(state->SplitSse);
    Py_CLEAR(state->type_name);
    Py_CLEAR(state->view_class);
    return 0;
}

static void module_free(void *module) { module_clear((PyObject *)module); }

static PyModuleDef_Slot slots[] = {
    {Py_mod_exec, exec_module},
    {0, NULL},
};

static struct PyModuleDef moduledef = {
    PyModuleDef_HEAD_INIT,
    .m_name = "gateway.wire._views_c",
    .m_doc = "The partial decode of the commonest stream event, compiled (see gateway/wire/events.py).",
    .m_size = sizeof(ModuleState),
    .m_methods = methods,
    .m_slots = slots,
    .m_traverse = module_traverse,
    .m_clear = module_clear,
    .m_free = module_free,
};

PyMODINIT_FUNC PyInit__views_c(void)
{
    return PyModuleDef_Init(&moduledef);
}
