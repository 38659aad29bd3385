/* The hot spots of gateway/observability/otlp_proto.py in C: ``attributes``, repeated OTLP KeyValue fields
 * (``_attributes``), and ``span``, a Span message (``_span``), byte for byte what the pure-Python functions
 * (the fallback when this module is not built, and the reference its tests compare it with) write.
 *
 * Each call measures first, then writes: one walk over the arguments computes the message's size (every
 * attribute's key and value read once, into a record: its UTF-8, its varint bits, its sizes), one bytes
 * object of that size is allocated, and a second walk over the records fills it. No Python code runs
 * between the two walks (the arguments are converted, and a mapping other than a dict turned into its
 * list of items, before the first), so what was measured is what is written.
 *
 * And ``request_spans``: a traced request's SERVER and CLIENT spans straight from its Finished record, its
 * RequestTrace and its AttemptSpans (tracing.py's ``_request_spans_py``, the reference), each span's attributes
 * written into a growing buffer, then the Span around them by the same writer as ``span``'s (SpanFields).
 *
 * Optional: setup.py builds it when a C compiler is there. Nothing but the CPython C API.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <stdint.h>
#include <string.h>
#include <math.h>
#include <time.h>

/* The largest body this module measures: far enough below PY_SSIZE_T_MAX that adding a field's header
 * (at most 11 bytes) and one more field's size to a size under it never overflows. */
#define SIZE_LIMIT (PY_SSIZE_T_MAX / 4)
/* Attributes measured into records on the stack, more into PyMem */
#define STACK_ATTRIBUTES 32

/* Where request_spans finds an attribute in the objects of one type: the offset of its slot (a member
 * descriptor of an object slot: a __slots__ class's, a msgspec Struct's field), or -1 to read it through
 * getattr (anything else: a property, a dict entry); 0 until it was looked up. */
#define LAYOUTS 8
typedef struct {
    PyTypeObject *type; /* a strong reference */
    Py_ssize_t offsets[64];
} Layout;

typedef struct {
    PyObject *struct_error; /* struct.error: what struct.pack raises for a time that is not a uint64 */
    PyObject *names[64];    /* request_spans: the attribute names it reads, interned (NAMES) */
    Layout layouts[LAYOUTS]; /* of the types it read (Finished, Usage, RequestTrace, AttemptSpan) */
    int layout_count;
    PyObject *chat, *count_tokens, *empty, *add; /* record's strings, interned */
    PyObject *trace_type, *attempt_type, *getrandbits; /* bind(): new_trace's and attempt's */
    /* client_span's last ``server(url)``: the callable, the url (a str) and its (address, port) — a request's
     * attempts go to the URLs of a few targets, and ``server`` is a function of the url alone */
    PyObject *last_server, *last_url, *last_where;
} ModuleState;

static ModuleState *module_state(PyObject *module) { return (ModuleState *)PyModule_GetState(module); }

/* --- the wire format ----------------------------------------------------------------------------------- */

static inline Py_ssize_t varint_size(uint64_t v)
{
    Py_ssize_t n = 1;
    while (v >= 0x80) {
        v >>= 7;
        n++;
    }
    return n;
}

static inline char *put_varint(char *p, uint64_t v)
{
    while (v >= 0x80) {
        *p++ = (char)((v & 0x7F) | 0x80);
        v >>= 7;
    }
    *p++ = (char)v;
    return p;
}

static inline char *put_fixed64(char *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (char)(v >> (8 * i));
    return p + 8;
}

static inline char *put_fixed32(char *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (char)(v >> (8 * i));
    return p + 4;
}

/* A length-delimited field: its one-byte tag, ``size`` as a varint, the body */
static inline char *put_field(char *p, char tag, const char *data, Py_ssize_t size)
{
    *p++ = tag;
    p = put_varint(p, (uint64_t)size);
    memcpy(p, data, (size_t)size);
    return p + size;
}

static int too_large(void)
{
    PyErr_SetString(PyExc_OverflowError, "the OTLP message would be too large");
    return -1;
}

/* The size of a length-delimited field of a one-byte tag around a body of ``body`` bytes; -1 (OverflowError)
 * past SIZE_LIMIT. */
static inline Py_ssize_t field_size(Py_ssize_t body)
{
    if (body > SIZE_LIMIT)
        return too_large();
    return 1 + varint_size((uint64_t)body) + body;
}

/* ``value`` (an int) as an int64's varint bits, its two's complement; -1 with ValueError outside int64
 * (``_int64``'s message). */
static int int64_bits(PyObject *value, uint64_t *bits)
{
    int overflow;
    const long long n = PyLong_AsLongLongAndOverflow(value, &overflow);
    if (overflow) {
        PyErr_Format(PyExc_ValueError, "%S is outside int64", value);
        return -1;
    }
    if (n == -1 && PyErr_Occurred())
        return -1;
    *bits = (uint64_t)n;
    return 0;
}

/* --- AnyValue ------------------------------------------------------------------------------------------ */

enum { V_STRING, V_TRUE, V_FALSE, V_INT, V_DOUBLE, V_ARRAY };

/* An attribute value as ``_any_value`` encodes it, measured */
typedef struct {
    int kind;           /* V_* */
    const char *text;   /* V_STRING: its UTF-8 (the str's own buffer, or the UTF-8 cached in it) */
    Py_ssize_t length;  /* V_STRING: the UTF-8's length; V_ARRAY: the ArrayValue's */
    uint64_t bits;      /* V_INT: the int64's two's complement; V_DOUBLE: the IEEE 754 double's bits */
    PyObject *array;    /* V_ARRAY: the list or tuple (borrowed) */
    Py_ssize_t size;    /* the AnyValue message's size */
} Value;

static inline int measure_value(PyObject *object, Value *value);

/* ArrayValue{values (1): AnyValue...}: its size; -1 on error */
static Py_ssize_t measure_array(PyObject *sequence)
{
    /* A list's or a tuple's items as they are stored (not through a subclass's __iter__): no Python code
     * runs while measuring. */
    PyObject *const *items = PyList_Check(sequence) ? ((PyListObject *)sequence)->ob_item
                                                    : ((PyTupleObject *)sequence)->ob_item;
    const Py_ssize_t count = Py_SIZE(sequence);
    Py_ssize_t size = 0;
    if (Py_EnterRecursiveCall(" while encoding an OTLP array attribute"))
        return -1;
    for (Py_ssize_t i = 0; i < count; i++) {
        Value item;
        Py_ssize_t n;
        if (measure_value(items[i], &item) < 0 || (n = field_size(item.size)) < 0) {
            size = -1;
            break;
        }
        size += n;
        if (size > SIZE_LIMIT) {
            size = too_large();
            break;
        }
    }
    Py_LeaveRecursiveCall();
    return size;
}

/* ``object`` measured as an AnyValue: str (string_value), bool (bool_value, before int: a bool is an int),
 * int (int_value, int64), float (double_value), list or tuple (array_value, of such values); -1 with
 * ``_any_value``'s TypeError for another type, ValueError for an int outside int64. */
static inline int measure_value(PyObject *object, Value *value)
{
    Py_ssize_t size;
    if (PyUnicode_Check(object)) {
        if ((value->text = PyUnicode_AsUTF8AndSize(object, &value->length)) == NULL)
            return -1;
        value->kind = V_STRING;
        if ((size = field_size(value->length)) < 0)
            return -1;
        value->size = size;
    }
    else if (object == Py_True || object == Py_False) {
        value->kind = object == Py_True ? V_TRUE : V_FALSE;
        value->size = 2;
    }
    else if (PyLong_Check(object)) {
        if (int64_bits(object, &value->bits) < 0)
            return -1;
        value->kind = V_INT;
        value->size = 1 + varint_size(value->bits);
    }
    else if (PyFloat_Check(object)) {
        const double d = PyFloat_AS_DOUBLE(object);
        memcpy(&value->bits, &d, sizeof value->bits);
        value->kind = V_DOUBLE;
        value->size = 9;
    }
    else if (PyList_Check(object) || PyTuple_Check(object)) {
        if ((value->length = measure_array(object)) < 0 || (size = field_size(value->length)) < 0)
            return -1;
        value->kind = V_ARRAY;
        value->array = object;
        value->size = size;
    }
    else {
        PyObject *name = PyType_GetName(Py_TYPE(object));
        if (name != NULL) {
            PyErr_Format(PyExc_TypeError, "unsupported attribute value %R (%U)", object, name);
            Py_DECREF(name);
        }
        return -1;
    }
    return 0;
}

static char *put_array(char *p, const Value *value);

/* The AnyValue measured into ``value`` (without its field's tag and length); NULL on error (an array's
 * items are measured again, which cannot fail after they were once, but is checked). */
static inline char *put_value(char *p, const Value *value)
{
    switch (value->kind) {
    case V_STRING:
        return put_field(p, 0x0a, value->text, value->length); /* string_value (1) */
    case V_TRUE:
    case V_FALSE:
        *p++ = 0x10; /* bool_value (2) */
        *p++ = value->kind == V_TRUE;
        return p;
    case V_INT:
        *p++ = 0x18; /* int_value (3) */
        return put_varint(p, value->bits);
    case V_DOUBLE:
        *p++ = 0x21; /* double_value (4), fixed64 */
        return put_fixed64(p, value->bits);
    default:
        return put_array(p, value);
    }
}

/* array_value (5): ArrayValue{values (1): AnyValue...} */
static char *put_array(char *p, const Value *value)
{
    PyObject *const *items = PyList_Check(value->array) ? ((PyListObject *)value->array)->ob_item
                                                        : ((PyTupleObject *)value->array)->ob_item;
    const Py_ssize_t count = Py_SIZE(value->array);
    *p++ = 0x2a;
    p = put_varint(p, (uint64_t)value->length);
    for (Py_ssize_t i = 0; i < count; i++) {
        Value item;
        if (measure_value(items[i], &item) < 0)
            return NULL;
        *p++ = 0x0a;
        p = put_varint(p, (uint64_t)item.size);
        if ((p = put_value(p, &item)) == NULL)
            return NULL;
    }
    return p;
}

/* --- attributes ---------------------------------------------------------------------------------------- */

/* One attribute, KeyValue{key (1), value (2)}, measured */
typedef struct {
    const char *key; /* its UTF-8 */
    Py_ssize_t key_length;
    Value value;
    Py_ssize_t size; /* the KeyValue message's */
} Attribute;

/* A mapping's attributes, measured */
typedef struct {
    Attribute *items; /* ``stack`` or PyMem */
    Py_ssize_t count;
    Py_ssize_t size;  /* of the repeated fields, their tags and lengths included */
    PyObject *pairs;  /* a mapping other than a dict: its items() as a list (owned; it keeps them alive) */
    Attribute stack[STACK_ATTRIBUTES];
} Attributes;

static void attributes_init(Attributes *a)
{
    a->items = a->stack;
    a->count = a->size = 0;
    a->pairs = NULL;
}

static void attributes_release(Attributes *a)
{
    if (a->items != a->stack)
        PyMem_Free(a->items);
    a->items = a->stack;
    Py_CLEAR(a->pairs);
}

static int measure_attribute(PyObject *key, PyObject *object, Attribute *attribute)
{
    if (!PyUnicode_Check(key)) {
        PyErr_Format(PyExc_TypeError, "attribute keys must be str, not %.100s", Py_TYPE(key)->tp_name);
        return -1;
    }
    if ((attribute->key = PyUnicode_AsUTF8AndSize(key, &attribute->key_length)) == NULL)
        return -1;
    if (measure_value(object, &attribute->value) < 0)
        return -1;
    /* key (1): "" is left out, as proto3 does; value (2): always (its oneof set) */
    const Py_ssize_t key_size = attribute->key_length ? field_size(attribute->key_length) : 0;
    const Py_ssize_t value_size = field_size(attribute->value.size);
    if (key_size < 0 || value_size < 0)
        return -1;
    attribute->size = key_size + value_size;
    return 0;
}

/* ``mapping``'s items measured into ``a`` (attributes_init'ed; attributes_release it, error or not).
 * A dict is read in place (PyDict_Next: its items() in order); any other mapping through its items(),
 * whose Python code runs here, before anything is measured. */
static int measure_attributes(Attributes *a, PyObject *mapping)
{
    Py_ssize_t count;
    if (PyDict_CheckExact(mapping))
        count = PyDict_GET_SIZE(mapping);
    else {
        if ((a->pairs = PyMapping_Items(mapping)) == NULL)
            return -1;
        count = PyList_GET_SIZE(a->pairs);
        for (Py_ssize_t i = 0; i < count; i++) {
            PyObject *pair = PyList_GET_ITEM(a->pairs, i);
            if (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2) {
                PyErr_SetString(PyExc_TypeError, "attributes.items() must give (key, value) pairs");
                return -1;
            }
        }
    }
    if (count > STACK_ATTRIBUTES) {
        if ((a->items = PyMem_New(Attribute, (size_t)count)) == NULL) {
            a->items = a->stack;
            PyErr_NoMemory();
            return -1;
        }
    }
    Py_ssize_t size = 0, pos = 0;
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *key, *object;
        if (a->pairs != NULL) {
            PyObject *pair = PyList_GET_ITEM(a->pairs, i);
            key = PyTuple_GET_ITEM(pair, 0);
            object = PyTuple_GET_ITEM(pair, 1);
        }
        else if (!PyDict_Next(mapping, &pos, &key, &object)) { /* cannot happen: no Python code runs here */
            PyErr_SetString(PyExc_RuntimeError, "dictionary changed size during iteration");
            return -1;
        }
        Attribute *attribute = &a->items[i];
        Py_ssize_t n;
        if (measure_attribute(key, object, attribute) < 0 || (n = field_size(attribute->size)) < 0)
            return -1;
        size += n;
        if (size > SIZE_LIMIT)
            return too_large();
        a->count = i + 1;
    }
    a->size = size;
    return 0;
}

/* The measured attributes as repeated KeyValue fields under ``tag``; NULL on error */
static char *put_attributes(char *p, const Attributes *a, char tag)
{
    for (Py_ssize_t i = 0; i < a->count; i++) {
        const Attribute *attribute = &a->items[i];
        *p++ = tag;
        p = put_varint(p, (uint64_t)attribute->size);
        if (attribute->key_length)
            p = put_field(p, 0x0a, attribute->key, attribute->key_length);
        *p++ = 0x12;
        p = put_varint(p, (uint64_t)attribute->value.size);
        if ((p = put_value(p, &attribute->value)) == NULL)
            return NULL;
    }
    return p;
}

/* The end of a written message: its expected end, or a SystemError (a bug: measured and written differ) */
static PyObject *finished(PyObject *bytes, const char *end)
{
    if (end == NULL) {
        Py_DECREF(bytes);
        return NULL;
    }
    if (end != PyBytes_AS_STRING(bytes) + PyBytes_GET_SIZE(bytes)) {
        Py_DECREF(bytes);
        PyErr_SetString(PyExc_SystemError, "_otlp_c: the message written is not the size measured");
        return NULL;
    }
    return bytes;
}

PyDoc_STRVAR(attributes_doc,
"attributes(attributes, tag, /) -> bytes\n\n"
"Repeated KeyValue fields under ``tag`` (0x0a: Resource.attributes; 0x4a: Span.attributes,\n"
"HistogramDataPoint.attributes), one per item of the mapping ``attributes``, in order: what\n"
"otlp_proto._attributes(attributes, bytes([tag])) returns. Values: str, bool, int (int64; ValueError\n"
"outside), float, or a list or tuple of such values; TypeError for any other.");

static PyObject *attributes(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 2) {
        PyErr_Format(PyExc_TypeError, "attributes() takes exactly 2 arguments (%zd given)", nargs);
        return NULL;
    }
    const long tag = PyLong_AsLong(args[1]);
    if (tag == -1 && PyErr_Occurred())
        return NULL;
    if (tag != 0x0a && tag != 0x4a) {
        PyErr_Format(PyExc_ValueError, "attributes(): tag must be 0x0a or 0x4a, not %#lx", tag);
        return NULL;
    }
    Attributes a;
    attributes_init(&a);
    PyObject *result = NULL;
    if (measure_attributes(&a, args[0]) == 0 && (result = PyBytes_FromStringAndSize(NULL, a.size)) != NULL)
        result = finished(result, put_attributes(PyBytes_AS_STRING(result), &a, (char)tag));
    attributes_release(&a);
    return result;
}

/* --- spans --------------------------------------------------------------------------------------------- */

/* A bytes argument: its data; a false value other than bytes (None) is b"" when ``optional``; TypeError
 * otherwise. */
static int bytes_argument(PyObject *object, const char *name, int optional, const char **data, Py_ssize_t *length)
{
    if (PyBytes_Check(object)) {
        *data = PyBytes_AS_STRING(object);
        *length = PyBytes_GET_SIZE(object);
        return 0;
    }
    if (optional) {
        const int truth = PyObject_IsTrue(object);
        if (truth < 0)
            return -1;
        if (!truth) {
            *data = NULL;
            *length = 0;
            return 0;
        }
    }
    PyErr_Format(PyExc_TypeError, "span(): %s must be bytes, not %.100s", name, Py_TYPE(object)->tp_name);
    return -1;
}

/* A str argument: its UTF-8; a false value other than str (None) is "", as ``if text:`` reads it. */
static int text_argument(PyObject *object, const char *name, const char **data, Py_ssize_t *length)
{
    if (PyUnicode_Check(object))
        return (*data = PyUnicode_AsUTF8AndSize(object, length)) == NULL ? -1 : 0;
    const int truth = PyObject_IsTrue(object);
    if (truth < 0)
        return -1;
    if (!truth) {
        *data = NULL;
        *length = 0;
        return 0;
    }
    PyErr_Format(PyExc_TypeError, "span(): %s must be str, not %.100s", name, Py_TYPE(object)->tp_name);
    return -1;
}

/* An enum argument (kind, status code): ``*present`` 0 for 0 (a false value: left out), else its int64's
 * bits; ValueError outside int64, as ``_int64``. */
static int enum_argument(PyObject *object, const char *name, int *present, uint64_t *bits)
{
    if (PyLong_Check(object)) {
        if (int64_bits(object, bits) < 0)
            return -1;
        *present = *bits != 0;
        return 0;
    }
    const int truth = PyObject_IsTrue(object);
    if (truth < 0)
        return -1;
    if (!truth) {
        *present = 0;
        return 0;
    }
    PyErr_Format(PyExc_TypeError, "span(): %s must be int, not %.100s", name, Py_TYPE(object)->tp_name);
    return -1;
}

/* A time argument (fixed64): ``*present`` 0 for 0 (left out), else its value; struct.error outside uint64
 * or for a value that is not an int, as ``struct.pack("<Q", ...)``. */
static int time_argument(ModuleState *state, PyObject *object, int *present, uint64_t *value)
{
    PyObject *index;
    if (PyLong_Check(object))
        index = Py_NewRef(object);
    else {
        const int truth = PyObject_IsTrue(object);
        if (truth < 0)
            return -1;
        if (!truth) {
            *present = 0;
            return 0;
        }
        if (!PyIndex_Check(object)) {
            PyErr_SetString(state->struct_error, "required argument is not an integer");
            return -1;
        }
        if ((index = PyNumber_Index(object)) == NULL)
            return -1;
    }
    /* PyLong_AsLongLongAndOverflow first: a time before 2262 is an int64, and it is the quicker of the two
     * (PyLong_AsUnsignedLongLong goes through _PyLong_AsByteArray) */
    int overflow;
    const long long n = PyLong_AsLongLongAndOverflow(index, &overflow);
    if (n == -1 && !overflow && PyErr_Occurred()) {
        Py_DECREF(index);
        return -1;
    }
    if (overflow > 0) { /* past int64: a uint64 still, or out of range */
        *value = PyLong_AsUnsignedLongLong(index);
        if (*value == (unsigned long long)-1 && PyErr_Occurred()) {
            Py_DECREF(index);
            if (!PyErr_ExceptionMatches(PyExc_OverflowError))
                return -1;
            PyErr_Clear();
            PyErr_SetString(state->struct_error, "argument out of range");
            return -1;
        }
    }
    else if (overflow < 0 || n < 0) {
        Py_DECREF(index);
        PyErr_SetString(state->struct_error, "argument out of range");
        return -1;
    }
    else
        *value = (uint64_t)n;
    Py_DECREF(index);
    *present = *value != 0;
    return 0;
}

/* A Span message's fields other than its attributes: a zero number (kind, times, status code) or an empty
 * string is left out, as proto3 does; the name is ``name``, or ``name + " " + name2`` when ``name2`` is set
 * (the tracer's "{method} {route}", "{operation} {model}": no string made of them) */
typedef struct {
    const char *trace_id, *span_id, *parent, *trace_state, *name, *name2, *message;
    Py_ssize_t trace_id_length, span_id_length, parent_length, trace_state_length, name_length, name2_length;
    Py_ssize_t message_length;
    uint64_t kind, start, end, code;
    uint32_t flags; /* Span.flags (16) as written */
} SpanFields;

static inline Py_ssize_t span_name_length(const SpanFields *s)
{
    return s->name2 == NULL ? s->name_length : s->name_length + 1 + s->name2_length;
}

/* The size of the Status message */
static inline Py_ssize_t span_status_size(const SpanFields *s)
{
    return (s->message_length ? field_size(s->message_length) : 0) + (s->code ? 1 + varint_size(s->code) : 0);
}

/* The Span message's size with ``attributes`` bytes of attributes; -1 (OverflowError) past SIZE_LIMIT */
static Py_ssize_t span_size(const SpanFields *s, Py_ssize_t attributes)
{
    const Py_ssize_t lengths[] = {s->trace_id_length, s->span_id_length, s->trace_state_length, s->parent_length,
                                  span_name_length(s), s->message_length};
    Py_ssize_t size = 0, n;
    for (size_t i = 0; i < sizeof lengths / sizeof lengths[0]; i++) {
        if (lengths[i] > SIZE_LIMIT)
            return too_large();
        if (lengths[i] && i < 5) {
            if ((n = field_size(lengths[i])) < 0)
                return -1;
            size += n;
        }
    }
    if (attributes > SIZE_LIMIT || (n = field_size(span_status_size(s))) < 0)
        return too_large();
    size += (s->kind ? 1 + varint_size(s->kind) : 0) + (s->start ? 9 : 0) + (s->end ? 9 : 0);
    size += attributes + n + 6; /* ... the status, the flags (a tag of two bytes, a fixed32) */
    return size > SIZE_LIMIT ? too_large() : size;
}

/* The Span's fields before its attributes (1 to 8), in field-number order */
static char *put_span_head(char *p, const SpanFields *s)
{
    if (s->trace_id_length)
        p = put_field(p, 0x0a, s->trace_id, s->trace_id_length); /* trace_id (1) */
    if (s->span_id_length)
        p = put_field(p, 0x12, s->span_id, s->span_id_length); /* span_id (2) */
    if (s->trace_state_length)
        p = put_field(p, 0x1a, s->trace_state, s->trace_state_length); /* trace_state (3) */
    if (s->parent_length)
        p = put_field(p, 0x22, s->parent, s->parent_length); /* parent_span_id (4) */
    const Py_ssize_t name_length = span_name_length(s);
    if (name_length) {
        *p++ = 0x2a; /* name (5) */
        p = put_varint(p, (uint64_t)name_length);
        memcpy(p, s->name, (size_t)s->name_length);
        p += s->name_length;
        if (s->name2 != NULL) {
            *p++ = ' ';
            memcpy(p, s->name2, (size_t)s->name2_length);
            p += s->name2_length;
        }
    }
    if (s->kind) {
        *p++ = 0x30; /* kind (6), enum */
        p = put_varint(p, s->kind);
    }
    if (s->start) {
        *p++ = 0x39; /* start_time_unix_nano (7), fixed64 */
        p = put_fixed64(p, s->start);
    }
    if (s->end) {
        *p++ = 0x41; /* end_time_unix_nano (8), fixed64 */
        p = put_fixed64(p, s->end);
    }
    return p;
}

/* The Span's fields after its attributes: status (15), always (the SDK sets it): Status{message (2), code (3)};
 * flags (16), fixed32 */
static char *put_span_tail(char *p, const SpanFields *s)
{
    *p++ = 0x7a;
    p = put_varint(p, (uint64_t)span_status_size(s));
    if (s->message_length)
        p = put_field(p, 0x12, s->message, s->message_length);
    if (s->code) {
        *p++ = 0x18;
        p = put_varint(p, s->code);
    }
    *p++ = (char)0x85;
    *p++ = 0x01;
    return put_fixed32(p, s->flags);
}

PyDoc_STRVAR(span_doc,
"span(trace_id, span_id, parent_span_id, trace_state, name, kind, start_ns, end_ns, attributes,\n"
"     status_code, status_message, flags, parent_is_remote, /) -> bytes\n\n"
"A Span message (without its field's tag and length) of a SpanRecord's fields, in their order: what\n"
"otlp_proto._span(SpanRecord(...)) returns. ``attributes``: bytes (made by encode_attributes, written as\n"
"they are) or a mapping (encoded as attributes(attributes, 0x4a)).");

static PyObject *span(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 13) {
        PyErr_Format(PyExc_TypeError, "span() takes exactly 13 arguments (%zd given)", nargs);
        return NULL;
    }
    ModuleState *state = module_state(module);
    SpanFields s = {.name2 = NULL};
    const char *raw = NULL;
    Py_ssize_t raw_length = 0;
    int has_kind, has_start, has_end, has_code;
    /* Every argument converted (Python code may run: __bool__, __index__, a mapping's items()) before
     * anything is measured */
    if (bytes_argument(args[0], "trace_id", 0, &s.trace_id, &s.trace_id_length) < 0 ||
        bytes_argument(args[1], "span_id", 0, &s.span_id, &s.span_id_length) < 0 ||
        bytes_argument(args[2], "parent_span_id", 1, &s.parent, &s.parent_length) < 0 ||
        text_argument(args[3], "trace_state", &s.trace_state, &s.trace_state_length) < 0 ||
        text_argument(args[4], "name", &s.name, &s.name_length) < 0 ||
        enum_argument(args[5], "kind", &has_kind, &s.kind) < 0 ||
        time_argument(state, args[6], &has_start, &s.start) < 0 ||
        time_argument(state, args[7], &has_end, &s.end) < 0 ||
        enum_argument(args[9], "status_code", &has_code, &s.code) < 0 ||
        text_argument(args[10], "status_message", &s.message, &s.message_length) < 0)
        return NULL;
    s.kind = has_kind ? s.kind : 0; /* absent: left out, as a zero is */
    s.start = has_start ? s.start : 0;
    s.end = has_end ? s.end : 0;
    s.code = has_code ? s.code : 0;
    if (!PyLong_Check(args[11])) {
        PyErr_Format(PyExc_TypeError, "span(): flags must be int, not %.100s", Py_TYPE(args[11])->tp_name);
        return NULL;
    }
    /* flags (16): the W3C trace flags, SPAN_FLAGS_CONTEXT_HAS_IS_REMOTE_MASK, and
     * SPAN_FLAGS_CONTEXT_IS_REMOTE_MASK when the span has a parent and that parent is remote */
    s.flags = (uint32_t)(PyLong_AsUnsignedLongLongMask(args[11]) & 0xFF) | 0x100;
    if (PyErr_Occurred())
        return NULL;
    const int remote = PyObject_IsTrue(args[12]);
    if (remote < 0)
        return NULL;
    if (remote && s.parent_length)
        s.flags |= 0x200;
    PyObject *mapping = args[8];
    int has_mapping = 0;
    if (PyBytes_Check(mapping)) {
        raw = PyBytes_AS_STRING(mapping);
        raw_length = PyBytes_GET_SIZE(mapping);
    }
    else if (PyDict_CheckExact(mapping))
        has_mapping = PyDict_GET_SIZE(mapping) > 0;
    else if ((has_mapping = PyObject_IsTrue(mapping)) < 0)
        return NULL;

    Attributes a;
    attributes_init(&a);
    PyObject *result = NULL;
    if (has_mapping && measure_attributes(&a, mapping) < 0) /* from here on no Python code runs */
        goto done;
    const Py_ssize_t size = span_size(&s, raw_length + a.size);
    if (size < 0 || (result = PyBytes_FromStringAndSize(NULL, size)) == NULL)
        goto done;

    char *p = put_span_head(PyBytes_AS_STRING(result), &s);
    if (raw_length) { /* attributes (9): the bytes encode_attributes made of them */
        memcpy(p, raw, (size_t)raw_length);
        p += raw_length;
    }
    else if (a.count && (p = put_attributes(p, &a, 0x4a)) == NULL) /* attributes (9) */
        goto written;
    p = put_span_tail(p, &s);
written:
    result = finished(result, p);
done:
    attributes_release(&a);
    return result;
}

/* --- a request's spans --------------------------------------------------------------------------------- */

/* What ``request_spans`` reads of a Finished, a RequestTrace and an AttemptSpan, by name (interned once) */
enum {
    N_METHOD, N_PATH, N_STATUS, N_OUTCOME, N_ATTEMPTS, N_ALIAS, N_PROVIDER, N_MODEL, N_KEY_NAME, N_TEAM, N_USER,
    N_PANIC, N_LIMIT, N_DROPPED, N_REQUEST_ID, N_TTFT, N_COST_USD, N_UPSTREAM_REQUEST_ID, N_AGENT_ID, N_STREAM,
    N_SESSION_ID, N_RESPONSE_ID, N_RESPONSE_MODEL, N_FINISH_REASON, N_USAGE, N_UPSTREAM_WAIT,
    N_INPUT_TOKENS, N_OUTPUT_TOKENS, N_CACHE_READ, N_CACHE_CREATION,
    N_TRACE_ID, N_SPAN_ID, N_PARENT_ID, N_TRACE_STATE, N_FLAGS, N_START_NS, N_ROUTE, N_REQUEST_MODEL, N_PARAMS,
    N_ATTEMPTS_LIST, N_END_NS, N_ERROR_TYPE, N_PROVIDER_KIND, N_URL,
    N_TIMED, N_ROUTED, N_CAPTURE, N_DURATION,
    N_MAX_TOKENS, N_TEMPERATURE, N_TOP_P, N_TOP_K, N_STOP_SEQUENCES, N_TRACE,
    N_COUNT
};
_Static_assert(N_COUNT <= 64, "ModuleState.names holds 64");
static const char *const NAMES[N_COUNT] = {
    "method", "path", "status", "outcome", "attempts", "alias", "provider", "model", "key_name", "team", "user",
    "panic", "limit", "dropped", "request_id", "ttft", "cost_usd", "upstream_request_id", "agent_id", "stream",
    "session_id", "response_id", "response_model", "finish_reason", "usage", "upstream_wait",
    "input_tokens", "output_tokens", "cache_read_input_tokens", "cache_creation_input_tokens",
    "trace_id", "span_id", "parent_id", "trace_state", "flags", "start_ns", "route", "request_model", "params",
    "attempts", "end_ns", "error_type", "provider_kind", "url",
    "timed", "routed", "capture", "duration",
    "max_tokens", "temperature", "top_p", "top_k", "stop_sequences", "trace",
};

/* A growing buffer: on the stack, then PyMem */
typedef struct {
    char *data;
    Py_ssize_t size, capacity;
    char stack[2048];
} Buffer;

static void buffer_init(Buffer *b)
{
    b->data = b->stack;
    b->size = 0;
    b->capacity = (Py_ssize_t)sizeof b->stack;
}

static void buffer_release(Buffer *b)
{
    if (b->data != b->stack)
        PyMem_Free(b->data);
    buffer_init(b);
}

static int buffer_grow(Buffer *b, Py_ssize_t more);

/* Room for ``more`` bytes past the end; -1 with an error */
static inline int buffer_reserve(Buffer *b, Py_ssize_t more)
{
    if (more >= 0 && more <= b->capacity - b->size) /* (capacity and size stay within SIZE_LIMIT) */
        return 0;
    return buffer_grow(b, more);
}

static int buffer_grow(Buffer *b, Py_ssize_t more)
{
    if (more > SIZE_LIMIT || b->size > SIZE_LIMIT - more)
        return too_large();
    if (b->size + more <= b->capacity)
        return 0;
    Py_ssize_t capacity = b->capacity * 2 > b->size + more ? b->capacity * 2 : b->size + more;
    if (capacity > SIZE_LIMIT) /* (the fast path's room never passes SIZE_LIMIT) */
        capacity = SIZE_LIMIT;
    char *data = b->data == b->stack ? PyMem_Malloc((size_t)capacity) : PyMem_Realloc(b->data, (size_t)capacity);
    if (data == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    if (b->data == b->stack)
        memcpy(data, b->stack, (size_t)b->size);
    b->data = data;
    b->capacity = capacity;
    return 0;
}

/* ``size`` bytes appended; -1 with an error */
static int buffer_append(Buffer *b, const char *data, Py_ssize_t size)
{
    if (buffer_reserve(b, size) < 0)
        return -1;
    memcpy(b->data + b->size, data, (size_t)size);
    b->size += size;
    return 0;
}

/* A string literal and its length (an attribute's key: no strlen per attribute) */
#define KEY(literal) ("" literal ""), ((Py_ssize_t)sizeof(literal) - 1)

/* One attribute (Span.attributes, 9): KeyValue{key (1), value (2): the measured AnyValue} */
static int put_measured(Buffer *b, const char *key, Py_ssize_t key_length, const Value *value)
{
    Py_ssize_t value_size = field_size(value->size);
    if (value_size < 0)
        return -1;
    const Py_ssize_t size = 1 + varint_size((uint64_t)key_length) + key_length + value_size;
    if (buffer_reserve(b, 1 + varint_size((uint64_t)size) + size) < 0)
        return -1;
    char *p = b->data + b->size;
    *p++ = 0x4a;
    p = put_varint(p, (uint64_t)size);
    p = put_field(p, 0x0a, key, key_length);
    *p++ = 0x12;
    p = put_varint(p, (uint64_t)value->size);
    if ((p = put_value(p, value)) == NULL)
        return -1;
    b->size = p - b->data;
    return 0;
}

/* An attribute of a Python value (``_any_value``'s types and errors) */
static int put_object(Buffer *b, const char *key, Py_ssize_t key_length, PyObject *object)
{
    Value value;
    if (object == NULL) /* its read failed */
        return -1;
    return measure_value(object, &value) < 0 ? -1 : put_measured(b, key, key_length, &value);
}

/* An attribute of an int64 */
static int put_int(Buffer *b, const char *key, Py_ssize_t key_length, long long n)
{
    Value value = {.kind = V_INT, .bits = (uint64_t)n};
    value.size = 1 + varint_size(value.bits);
    return put_measured(b, key, key_length, &value);
}

/* The attributes read off the objects: new references, released together */
typedef struct {
    ModuleState *state; /* the names (interned) and the layouts */
    PyObject *held[128];
    int count;
    PyTypeObject *last_type; /* the type of the object read last, and its layout: most reads follow one of */
    Layout *last_layout;     /* the same object's (NULL: none yet) */
} Reader;

/* The layout of ``type`` (NULL when the table is full: every attribute through getattr) */
static Layout *layout_of(ModuleState *state, PyTypeObject *type)
{
    for (int i = 0; i < state->layout_count; i++) {
        if (state->layouts[i].type == type)
            return &state->layouts[i];
    }
    if (state->layout_count == LAYOUTS)
        return NULL;
    Layout *layout = &state->layouts[state->layout_count++];
    layout->type = (PyTypeObject *)Py_NewRef((PyObject *)type);
    memset(layout->offsets, 0, sizeof layout->offsets);
    return layout;
}

/* Where ``name`` is in objects of the layout's type: a slot's offset, or -1 (getattr) */
static Py_ssize_t offset_of(Layout *layout, PyObject *name, int index)
{
    Py_ssize_t offset = layout->offsets[index];
    if (offset)
        return offset;
    offset = -1;
    /* the class's attribute of that name: a member descriptor of an object slot is a data descriptor, which
     * an instance's __dict__ (if any) cannot hide */
    PyObject *descriptor = _PyType_Lookup(layout->type, name); /* borrowed */
    if (descriptor != NULL && Py_IS_TYPE(descriptor, &PyMemberDescr_Type)) {
        PyMemberDef *member = ((PyMemberDescrObject *)descriptor)->d_member;
        if (member->type == T_OBJECT_EX && !(member->flags & READ_RESTRICTED) && member->offset > 0)
            offset = member->offset;
    }
    layout->offsets[index] = offset;
    return offset;
}

/* ``value`` (a new reference) kept until the reader is released; -1 (and it released) when there is no room */
static int hold(Reader *r, PyObject *value)
{
    if (r->count == (int)(sizeof r->held / sizeof r->held[0])) {
        Py_DECREF(value);
        PyErr_SetString(PyExc_SystemError, "_otlp_c: too many attributes read");
        return -1;
    }
    r->held[r->count++] = value;
    return 0;
}

/* ``object.<name>`` (borrowed from the reader); NULL with an error. A slot is read where it is (what its
 * member descriptor would do, without the look-ups of getattr); anything else through getattr. */
static PyObject *field(Reader *r, PyObject *object, int name)
{
    PyObject *value;
    Layout *layout;
    if (Py_TYPE(object) == r->last_type)
        layout = r->last_layout;
    else {
        layout = layout_of(r->state, Py_TYPE(object));
        r->last_type = Py_TYPE(object); /* the layout table holds the type: it outlives the reader */
        r->last_layout = layout;
    }
    const Py_ssize_t offset = layout == NULL ? -1 : offset_of(layout, r->state->names[name], name);
    if (offset > 0) {
        value = *(PyObject **)((char *)object + offset);
        if (value == NULL) {
            PyErr_Format(PyExc_AttributeError, "'%.100s' object has no attribute '%U'", Py_TYPE(object)->tp_name,
                         r->state->names[name]);
            return NULL;
        }
        Py_INCREF(value);
    }
    else if ((value = PyObject_GetAttr(object, r->state->names[name])) == NULL)
        return NULL;
    return hold(r, value) < 0 ? NULL : value;
}

static void reader_release(Reader *r)
{
    for (int i = 0; i < r->count; i++)
        Py_DECREF(r->held[i]);
    r->count = 0;
}

/* ``if value:`` (an error: -1); a str, None and a bool without a call */
static inline int truthy(PyObject *value)
{
    if (value == NULL)
        return -1;
    if (PyUnicode_CheckExact(value))
        return PyUnicode_GET_LENGTH(value) != 0;
    if (value == Py_None || value == Py_False)
        return 0;
    if (value == Py_True)
        return 1;
    return PyObject_IsTrue(value);
}

/* ``attribute`` when ``value`` is true (``if value: attributes[key] = value``) */
static int put_if(Buffer *b, const char *key, Py_ssize_t key_length, PyObject *value)
{
    const int truth = truthy(value);
    return truth <= 0 ? truth : put_object(b, key, key_length, value);
}

/* ``attribute`` unless ``value`` is None */
static int put_unless_none(Buffer *b, const char *key, Py_ssize_t key_length, PyObject *value)
{
    return value == NULL ? -1 : value == Py_None ? 0 : put_object(b, key, key_length, value);
}

/* An int or None (``or 0``): its value; -1 with an error (ValueError outside int64) */
static int count_of(PyObject *value, long long *n)
{
    if (value == NULL)
        return -1;
    if (value == Py_None) {
        *n = 0;
        return 0;
    }
    uint64_t bits;
    if (!PyLong_Check(value)) {
        PyErr_Format(PyExc_TypeError, "a token count must be int, not %.100s", Py_TYPE(value)->tp_name);
        return -1;
    }
    if (int64_bits(value, &bits) < 0)
        return -1;
    *n = (long long)bits;
    return 0;
}

static int sum_of(long long a, long long b, long long c, long long *sum)
{
    if (__builtin_add_overflow(a, b, sum) || __builtin_add_overflow(*sum, c, sum)) {
        PyErr_SetString(PyExc_ValueError, "a token sum is outside int64");
        return -1;
    }
    return 0;
}

/* ``_request_facts``: what the client asked, the operation, the provider and the conversation */
static int put_request(Reader *r, Buffer *b, PyObject *f, PyObject *operation, PyObject *model, PyObject *provider,
                       PyObject *params)
{
    if (put_object(b, KEY("gen_ai.operation.name"), operation) < 0 ||
        put_object(b, KEY("gen_ai.request.model"), model) < 0 ||
        put_object(b, KEY("gen_ai.request.stream"), field(r, f, N_STREAM)) < 0 ||
        put_if(b, KEY("gen_ai.provider.name"), provider) < 0)
        return -1;
    if (!PyTuple_Check(params) || PyTuple_GET_SIZE(params) != 5) {
        PyErr_SetString(PyExc_TypeError, "RequestTrace.params must be a tuple of five");
        return -1;
    }
    if (put_unless_none(b, KEY("gen_ai.request.max_tokens"), PyTuple_GET_ITEM(params, 0)) < 0 ||
        put_unless_none(b, KEY("gen_ai.request.temperature"), PyTuple_GET_ITEM(params, 1)) < 0 ||
        put_unless_none(b, KEY("gen_ai.request.top_p"), PyTuple_GET_ITEM(params, 2)) < 0 ||
        put_unless_none(b, KEY("gen_ai.request.top_k"), PyTuple_GET_ITEM(params, 3)) < 0)
        return -1;
    if (put_if(b, KEY("gen_ai.request.stop_sequences"), PyTuple_GET_ITEM(params, 4)) < 0)
        return -1;
    return put_if(b, KEY("gen_ai.conversation.id"), field(r, f, N_SESSION_ID));
}

/* ``_answer``: the answer's id, model, stop reason and usage (input tokens: Anthropic's arithmetic) */
static int put_answer(Reader *r, Buffer *b, PyObject *f)
{
    if (put_if(b, KEY("gen_ai.response.id"), field(r, f, N_RESPONSE_ID)) < 0 ||
        put_if(b, KEY("gen_ai.response.model"), field(r, f, N_RESPONSE_MODEL)) < 0)
        return -1;
    PyObject *reason = field(r, f, N_FINISH_REASON);
    const int truth = truthy(reason);
    if (truth < 0)
        return -1;
    if (truth) {
        PyObject *reasons = PyTuple_Pack(1, reason);
        if (reasons == NULL)
            return -1;
        const int done = put_object(b, KEY("gen_ai.response.finish_reasons"), reasons);
        Py_DECREF(reasons);
        if (done < 0)
            return -1;
    }
    PyObject *usage = field(r, f, N_USAGE);
    if (usage == NULL)
        return -1;
    PyObject *input = field(r, usage, N_INPUT_TOKENS), *output = field(r, usage, N_OUTPUT_TOKENS);
    if (input == NULL || output == NULL)
        return -1;
    if (input == Py_None && output == Py_None)
        return 0;
    long long in, out, cache_read, created, total;
    if (count_of(input, &in) < 0 || count_of(output, &out) < 0 ||
        count_of(field(r, usage, N_CACHE_READ), &cache_read) < 0 ||
        count_of(field(r, usage, N_CACHE_CREATION), &created) < 0 || sum_of(in, cache_read, created, &total) < 0)
        return -1;
    return put_int(b, KEY("gen_ai.usage.input_tokens"), total) < 0 ||
                   put_int(b, KEY("gen_ai.usage.output_tokens"), out) < 0 ||
                   put_int(b, KEY("gen_ai.usage.cache_read.input_tokens"), cache_read) < 0 ||
                   put_int(b, KEY("gen_ai.usage.cache_creation.input_tokens"), created) < 0
               ? -1
               : 0;
}

/* PyLong_AsLongLong and PyLong_AsUnsignedLongLong, the same values and errors, without 3.11's _PyLong_AsByteArray
 * (~170-280 instructions) for an int in range: PyLong_AsLongLongAndOverflow reads its digits */
static inline long long int64_of(PyObject *value)
{
    if (PyLong_CheckExact(value)) {
        int overflow;
        const long long n = PyLong_AsLongLongAndOverflow(value, &overflow);
        if (!overflow)
            return n;
    }
    return PyLong_AsLongLong(value);
}

static inline unsigned long long uint64_of(PyObject *value)
{
    if (PyLong_CheckExact(value)) {
        int overflow;
        const long long n = PyLong_AsLongLongAndOverflow(value, &overflow);
        if (!overflow && n >= 0)
            return (unsigned long long)n;
    }
    return PyLong_AsUnsignedLongLong(value);
}

/* A time (an int, 0 for none): its uint64; -1 with an error */
static int time_of(PyObject *value, uint64_t *t)
{
    if (value == NULL)
        return -1;
    if (!PyLong_Check(value)) {
        PyErr_Format(PyExc_TypeError, "a time must be int, not %.100s", Py_TYPE(value)->tp_name);
        return -1;
    }
    *t = uint64_of(value);
    return *t == (unsigned long long)-1 && PyErr_Occurred() ? -1 : 0;
}

/* A str's UTF-8 (TypeError for another type) */
static const char *utf8_of(PyObject *value, Py_ssize_t *length, const char *what)
{
    if (value == NULL)
        return NULL;
    if (!PyUnicode_Check(value)) {
        PyErr_Format(PyExc_TypeError, "%s must be str, not %.100s", what, Py_TYPE(value)->tp_name);
        return NULL;
    }
    return PyUnicode_AsUTF8AndSize(value, length);
}

static const char *bytes_of(PyObject *value, Py_ssize_t *length, const char *what)
{
    if (value == NULL)
        return NULL;
    if (!PyBytes_Check(value)) {
        PyErr_Format(PyExc_TypeError, "%s must be bytes, not %.100s", what, Py_TYPE(value)->tp_name);
        return NULL;
    }
    *length = PyBytes_GET_SIZE(value);
    return PyBytes_AS_STRING(value);
}

/* ``encode_span_fields`` of ``s`` and the attributes in ``b``, appended to ``spans``: the ScopeSpans.spans field
 * (tag and length) around a Span message */
static int append_span(PyObject *spans, const SpanFields *s, const Buffer *b)
{
    const Py_ssize_t size = span_size(s, b->size);
    if (size < 0)
        return -1;
    PyObject *result = PyBytes_FromStringAndSize(NULL, 1 + varint_size((uint64_t)size) + size);
    if (result == NULL)
        return -1;
    char *p = PyBytes_AS_STRING(result);
    *p++ = 0x12; /* ScopeSpans.spans (2) */
    p = put_varint(p, (uint64_t)size);
    p = put_span_head(p, s);
    memcpy(p, b->data, (size_t)b->size); /* attributes (9) */
    p = put_span_tail(p + b->size, s);
    if ((result = finished(result, p)) == NULL)
        return -1;
    const int appended = PyList_Append(spans, result);
    Py_DECREF(result);
    return appended;
}

/* The SERVER span (tracing.py's ``_server_span``) */
static int server_span(Reader *r, Buffer *b, PyObject *f, PyObject *trace, SpanFields *s, PyObject *operation,
                       PyObject *provider, PyObject *error_type, int answer, Buffer *kept, PyObject *spans)
{
    PyObject *path = field(r, f, N_PATH), *route = field(r, trace, N_ROUTE);
    const int has_route = truthy(route);
    if (has_route < 0 || path == NULL)
        return -1;
    if (!has_route)
        route = path;
    const int failed = truthy(error_type);
    if (failed < 0 || put_request(r, b, f, operation, field(r, trace, N_REQUEST_MODEL), provider,
                                  field(r, trace, N_PARAMS)) < 0)
        return -1;
    if (answer) {
        const Py_ssize_t from = b->size;
        if (put_answer(r, b, f) < 0 || buffer_append(kept, b->data + from, b->size - from) < 0)
            return -1;
    }
    PyObject *method = field(r, f, N_METHOD), *outcome = field(r, f, N_OUTCOME);
    if (put_object(b, KEY("http.request.method"), method) < 0 || put_object(b, KEY("http.route"), route) < 0 ||
        put_object(b, KEY("url.path"), path) < 0 ||
        put_if(b, KEY("http.response.status_code"), field(r, f, N_STATUS)) < 0 ||
        (failed && put_object(b, KEY("error.type"), error_type) < 0) ||
        put_object(b, KEY("messages_gateway.outcome"), outcome) < 0 ||
        put_object(b, KEY("messages_gateway.attempts"), field(r, f, N_ATTEMPTS)) < 0 ||
        put_if(b, KEY("messages_gateway.alias"), field(r, f, N_ALIAS)) < 0 ||
        put_if(b, KEY("messages_gateway.provider"), field(r, f, N_PROVIDER)) < 0 ||
        put_if(b, KEY("messages_gateway.upstream_model"), field(r, f, N_MODEL)) < 0 ||
        put_if(b, KEY("messages_gateway.key"), field(r, f, N_KEY_NAME)) < 0 ||
        put_if(b, KEY("messages_gateway.team"), field(r, f, N_TEAM)) < 0 ||
        put_if(b, KEY("enduser.id"), field(r, f, N_USER)) < 0)
        return -1;
    const int panic = truthy(field(r, f, N_PANIC));
    if (panic < 0 || (panic && put_object(b, KEY("messages_gateway.panic"), Py_True) < 0) ||
        put_if(b, KEY("messages_gateway.limit"), field(r, f, N_LIMIT)) < 0 ||
        put_if(b, KEY("messages_gateway.dropped"), field(r, f, N_DROPPED)) < 0 ||
        put_object(b, KEY("messages_gateway.request_id"), field(r, f, N_REQUEST_ID)) < 0 ||
        put_unless_none(b, KEY("gen_ai.response.time_to_first_chunk"), field(r, f, N_TTFT)) < 0 ||
        put_unless_none(b, KEY("messages_gateway.cost_usd"), field(r, f, N_COST_USD)) < 0 ||
        put_if(b, KEY("messages_gateway.upstream_request_id"), field(r, f, N_UPSTREAM_REQUEST_ID)) < 0 ||
        put_if(b, KEY("messages_gateway.agent_id"), field(r, f, N_AGENT_ID)) < 0)
        return -1;
    if ((s->span_id = bytes_of(field(r, trace, N_SPAN_ID), &s->span_id_length, "RequestTrace.span_id")) == NULL ||
        (s->name = utf8_of(method, &s->name_length, "Finished.method")) == NULL ||
        (s->name2 = utf8_of(route, &s->name2_length, "http.route")) == NULL ||
        time_of(field(r, trace, N_START_NS), &s->start) < 0)
        return -1;
    s->kind = 2; /* SPAN_KIND_SERVER */
    s->code = failed ? 2 : 0;
    s->message_length = 0;
    if (failed && (s->message = utf8_of(outcome, &s->message_length, "Finished.outcome")) == NULL)
        return -1;
    const uint32_t flags = s->flags;
    if (s->parent_length)
        s->flags |= 0x200; /* the caller's span: remote */
    const int appended = append_span(spans, s, b);
    s->flags = flags;
    return appended;
}

/* ``server(url)`` (a new reference), checked to be (address, port); the last one again when ``server`` and the
 * url (an exact str) are the last call's */
static PyObject *server_of(ModuleState *state, PyObject *server, PyObject *url)
{
    PyObject *last = state->last_url;
    if (last != NULL && server == state->last_server && PyUnicode_CheckExact(url) &&
        (url == last || (PyUnicode_GET_LENGTH(url) == PyUnicode_GET_LENGTH(last) && PyUnicode_Compare(url, last) == 0)))
        return Py_NewRef(state->last_where);
    PyObject *where = PyObject_CallOneArg(server, url);
    if (where == NULL)
        return NULL;
    if (!PyTuple_Check(where) || PyTuple_GET_SIZE(where) != 2) {
        Py_DECREF(where);
        PyErr_SetString(PyExc_TypeError, "server(url) must return (address, port)");
        return NULL;
    }
    if (PyUnicode_CheckExact(url)) {
        Py_XSETREF(state->last_server, Py_NewRef(server));
        Py_XSETREF(state->last_url, Py_NewRef(url));
        Py_XSETREF(state->last_where, Py_NewRef(where));
    }
    return where;
}

/* An attempt's CLIENT span (tracing.py's ``_client_span``) */
static int client_span(Reader *r, Buffer *b, PyObject *f, PyObject *trace, SpanFields *s, PyObject *attempt,
                       Py_ssize_t n, int serving, uint64_t end_ns, PyObject *operation, PyObject *request_error,
                       const Buffer *answer, PyObject *providers, PyObject *server, PyObject *spans)
{
    PyObject *error_type = field(r, attempt, N_ERROR_TYPE);
    int failed = truthy(error_type);
    if (failed < 0)
        return -1;
    const int answered = !failed && serving;
    if (answered) {
        error_type = request_error;
        if ((failed = truthy(error_type)) < 0)
            return -1;
    }
    PyObject *model = field(r, attempt, N_MODEL), *kind = field(r, attempt, N_PROVIDER_KIND);
    if (model == NULL || kind == NULL)
        return -1;
    PyObject *provider = PyDict_GetItemWithError(providers, kind); /* borrowed */
    if (provider == NULL) {
        if (PyErr_Occurred())
            return -1;
        provider = Py_None;
    }
    if (put_request(r, b, f, operation, model, provider, field(r, trace, N_PARAMS)) <
        0)
        return -1;
    PyObject *url = field(r, attempt, N_URL);
    const int has_url = truthy(url);
    if (has_url < 0)
        return -1;
    if (has_url) {
        PyObject *where = server_of(r->state, server, url);
        if (where == NULL || hold(r, where) < 0)
            return -1;
        if (put_object(b, KEY("server.address"), PyTuple_GET_ITEM(where, 0)) < 0 ||
            put_object(b, KEY("server.port"), PyTuple_GET_ITEM(where, 1)) < 0)
            return -1;
    }
    if (put_object(b, KEY("messages_gateway.provider"), field(r, attempt, N_PROVIDER)) <
            0 ||
        put_int(b, KEY("messages_gateway.attempt"), (long long)n + 1) < 0 ||
        put_if(b, KEY("http.response.status_code"), field(r, attempt, N_STATUS)) < 0 ||
        (failed && put_object(b, KEY("error.type"), error_type) < 0))
        return -1;
    if (answered && ((answer != NULL && buffer_append(b, answer->data, answer->size) < 0) ||
                     put_unless_none(b, KEY("gen_ai.response.time_to_first_chunk"), field(r, f, N_UPSTREAM_WAIT)) < 0 ||
                     put_if(b, KEY("messages_gateway.upstream_request_id"), field(r, f, N_UPSTREAM_REQUEST_ID)) < 0))
        return -1;
    uint64_t end;
    if ((s->span_id = bytes_of(field(r, attempt, N_SPAN_ID), &s->span_id_length, "AttemptSpan.span_id")) == NULL ||
        (s->name = utf8_of(operation, &s->name_length, "the operation")) == NULL ||
        (s->name2 = utf8_of(model, &s->name2_length, "AttemptSpan.model")) == NULL ||
        time_of(field(r, attempt, N_START_NS), &s->start) < 0 || time_of(field(r, attempt, N_END_NS), &end) < 0)
        return -1;
    s->end = end ? end : end_ns;
    s->kind = 3; /* SPAN_KIND_CLIENT */
    s->code = failed ? 2 : 0;
    s->message_length = 0;
    if (failed && (s->message = utf8_of(error_type, &s->message_length, "error.type")) == NULL)
        return -1;
    return append_span(spans, s, b);
}

PyDoc_STRVAR(request_spans_doc,
"request_spans(f, trace, end_ns, operation, provider, error_type, answer, providers, server, spans, /)\n\n"
"A traced request's SERVER span, then one CLIENT span per attempt, appended to the list ``spans`` as\n"
"``encode_span_fields`` makes them: what tracing.py's ``_request_spans`` appends (not for a trace that\n"
"captures content). ``f``: the Finished; ``trace``: its RequestTrace; ``answer``: whether the answer's\n"
"attributes go in; ``providers``: GEN_AI_PROVIDERS; ``server``: a url's (address, port).");

/* A request's spans appended to ``spans`` (``request_spans``' work); -1 with an error */
static int spans_of(ModuleState *state, PyObject *f, PyObject *trace, uint64_t end_ns, PyObject *operation,
                    PyObject *provider, PyObject *error_type, int answer, PyObject *providers, PyObject *server,
                    PyObject *spans)
{
    Reader r;
    r.state = state;
    r.count = 0;
    r.last_type = NULL;
    Buffer b, kept; /* the span's attributes; the answer's, kept for the serving attempt's span */
    buffer_init(&b);
    buffer_init(&kept);
    SpanFields s;
    int result = -1;
    PyObject *flags = field(&r, trace, N_FLAGS);
    if ((s.trace_id = bytes_of(field(&r, trace, N_TRACE_ID), &s.trace_id_length, "RequestTrace.trace_id")) == NULL ||
        (s.parent = bytes_of(field(&r, trace, N_PARENT_ID), &s.parent_length, "RequestTrace.parent_id")) == NULL ||
        (s.trace_state = utf8_of(field(&r, trace, N_TRACE_STATE), &s.trace_state_length, "trace_state")) == NULL ||
        flags == NULL)
        goto done;
    if (!PyLong_Check(flags)) {
        PyErr_SetString(PyExc_TypeError, "RequestTrace.flags must be int");
        goto done;
    }
    s.flags = (uint32_t)(PyLong_AsUnsignedLongLongMask(flags) & 0xFF) | 0x100;
    if (PyErr_Occurred())
        goto done;
    s.end = end_ns;
    if (server_span(&r, &b, f, trace, &s, operation, provider, error_type, answer, &kept, spans) < 0)
        goto done;
    /* the CLIENT spans: their parent is the SERVER span, theirs not remote */
    const char *server_id = s.span_id;
    const Py_ssize_t server_id_length = s.span_id_length;
    PyObject *attempts = field(&r, trace, N_ATTEMPTS_LIST);
    if (attempts == NULL)
        goto done;
    if (!PyList_Check(attempts)) {
        PyErr_SetString(PyExc_TypeError, "RequestTrace.attempts must be a list");
        goto done;
    }
    const Py_ssize_t count = PyList_GET_SIZE(attempts);
    for (Py_ssize_t n = 0; n < count; n++) {
        int mark = r.count;
        b.size = 0;
        s.parent = server_id;
        s.parent_length = server_id_length;
        if (client_span(&r, &b, f, trace, &s, PyList_GET_ITEM(attempts, n), n, n == count - 1, end_ns, operation,
                        error_type, answer ? &kept : NULL, providers, server, spans) < 0)
            goto done;
        /* this attempt's reads released (the list holds the attempts) */
        while (r.count > mark)
            Py_DECREF(r.held[--r.count]);
    }
    result = 0;
done:
    reader_release(&r);
    buffer_release(&b);
    buffer_release(&kept);
    return result;
}

static PyObject *request_spans(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 10) {
        PyErr_Format(PyExc_TypeError, "request_spans() takes exactly 10 arguments (%zd given)", nargs);
        return NULL;
    }
    if (!PyList_Check(args[9]) || !PyDict_Check(args[7])) {
        PyErr_SetString(PyExc_TypeError, "request_spans(): spans must be a list, providers a dict");
        return NULL;
    }
    const int answer = PyObject_IsTrue(args[6]);
    if (answer < 0)
        return NULL;
    uint64_t end_ns;
    if (time_of(args[2], &end_ns) < 0)
        return NULL;
    if (spans_of(module_state(module), args[0], args[1], end_ns, args[3], args[4], args[5], answer, args[7], args[8],
                 args[9]) < 0)
        return NULL;
    Py_RETURN_NONE;
}

/* --- a histogram series -------------------------------------------------------------------------------- */

/* genai_metrics.Series (the reference, and the fallback without this module) in C: a record is one C call,
 * its bucket found by a binary search over the bounds as doubles — the same bucket as ``bisect_left`` over the
 * Python numbers, since a bound must lie strictly within (-2**53, 2**53): an int there is a double exactly, and
 * an int outside is past every bound as a double too. */
typedef struct {
    PyObject_HEAD
    PyObject *bounds; /* the tuple it was made with */
    double *edges;    /* the bounds as doubles */
    long long *counts; /* len(bounds) + 1 */
    Py_ssize_t n;
    double sum, min, max;
    long long start_ns;
} Histogram;

static int histogram_init(Histogram *self, PyObject *args, PyObject *kwargs)
{
    static char *keywords[] = {"bounds", "start_ns", NULL};
    PyObject *bounds;
    long long start_ns;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O!L:Histogram", keywords, &PyTuple_Type, &bounds, &start_ns))
        return -1;
    if (self->bounds != NULL) {
        PyErr_SetString(PyExc_TypeError, "Histogram: made once");
        return -1;
    }
    const Py_ssize_t n = PyTuple_GET_SIZE(bounds);
    double *edges = PyMem_Malloc(sizeof(double) * (size_t)(n ? n : 1));
    long long *counts = PyMem_Calloc((size_t)n + 1, sizeof(long long));
    if (edges == NULL || counts == NULL) {
        PyMem_Free(edges);
        PyMem_Free(counts);
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        edges[i] = PyFloat_AsDouble(PyTuple_GET_ITEM(bounds, i));
        if (edges[i] == -1.0 && PyErr_Occurred()) {
            PyMem_Free(edges);
            PyMem_Free(counts);
            return -1;
        }
        if ((i && !(edges[i - 1] < edges[i])) || !(fabs(edges[i]) < 9007199254740992.0)) {
            PyMem_Free(edges);
            PyMem_Free(counts);
            PyErr_SetString(PyExc_ValueError, "Histogram: the bounds must increase, each within (-2**53, 2**53)");
            return -1;
        }
    }
    self->bounds = Py_NewRef(bounds);
    self->edges = edges;
    self->counts = counts;
    self->n = n;
    self->sum = 0.0;
    self->min = Py_HUGE_VAL;
    self->max = -Py_HUGE_VAL;
    self->start_ns = start_ns;
    return 0;
}

static void histogram_dealloc(Histogram *self)
{
    Py_XDECREF(self->bounds);
    PyMem_Free(self->edges);
    PyMem_Free(self->counts);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* One value, as a double, recorded */
static void histogram_put(Histogram *self, double v)
{
    Py_ssize_t lo = 0, hi = self->n; /* bisect_left: the first bound >= v */
    while (lo < hi) {
        const Py_ssize_t mid = (lo + hi) / 2;
        if (self->edges[mid] < v)
            lo = mid + 1;
        else
            hi = mid;
    }
    self->counts[lo]++;
    self->sum += v;
    if (v < self->min)
        self->min = v;
    if (v > self->max)
        self->max = v;
}

/* ``Series.add``: -1 with an error (a value that is not a number: TypeError; an int too large for a double:
 * OverflowError, as ``self.sum += value`` raises it) */
static int histogram_record(Histogram *self, PyObject *value)
{
    if (self->counts == NULL) {
        PyErr_SetString(PyExc_TypeError, "Histogram: not made");
        return -1;
    }
    double v;
    if (PyFloat_CheckExact(value))
        v = PyFloat_AS_DOUBLE(value);
    else if (PyLong_Check(value) || PyFloat_Check(value)) {
        v = PyFloat_AsDouble(value);
        if (v == -1.0 && PyErr_Occurred())
            return -1;
    }
    else {
        PyErr_Format(PyExc_TypeError, "a histogram records numbers, not %.100s", Py_TYPE(value)->tp_name);
        return -1;
    }
    histogram_put(self, v);
    return 0;
}

static PyObject *histogram_add(Histogram *self, PyObject *value)
{
    return histogram_record(self, value) < 0 ? NULL : Py_NewRef(Py_None);
}

static PyObject *histogram_counts(Histogram *self, void *closure)
{
    (void)closure;
    if (self->counts == NULL)
        return PyList_New(0);
    PyObject *counts = PyList_New(self->n + 1);
    if (counts == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i <= self->n; i++) {
        PyObject *count = PyLong_FromLongLong(self->counts[i]);
        if (count == NULL) {
            Py_DECREF(counts);
            return NULL;
        }
        PyList_SET_ITEM(counts, i, count);
    }
    return counts;
}

static PyMethodDef histogram_methods[] = {
    {"add", (PyCFunction)histogram_add, METH_O, "add(value, /)\n\nRecord one value (Series.add)."},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef histogram_members[] = {
    {"bounds", T_OBJECT, offsetof(Histogram, bounds), READONLY, "the bucket bounds"},
    {"sum", T_DOUBLE, offsetof(Histogram, sum), READONLY, "the values' sum"},
    {"min", T_DOUBLE, offsetof(Histogram, min), READONLY, "the least value (inf: none yet)"},
    {"max", T_DOUBLE, offsetof(Histogram, max), READONLY, "the greatest value (-inf: none yet)"},
    {"start_ns", T_LONGLONG, offsetof(Histogram, start_ns), READONLY, "when the series began"},
    {NULL, 0, 0, 0, NULL},
};

static PyGetSetDef histogram_getset[] = {
    {"counts", (getter)histogram_counts, NULL, "the bucket counts (a new list)", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject HistogramType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "gateway.observability._otlp_c.Histogram",
    .tp_doc = "Histogram(bounds, start_ns)\n\nOne histogram series (genai_metrics.Series, compiled).",
    .tp_basicsize = sizeof(Histogram),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)histogram_init,
    .tp_dealloc = (destructor)histogram_dealloc,
    .tp_methods = histogram_methods,
    .tp_members = histogram_members,
    .tp_getset = histogram_getset,
};

/* --- a batch of finished requests ------------------------------------------------------------------------ */

/* ``series.add(value)``: a compiled Histogram's record, anything else's ``add`` (the overflow, Series) */
static int add_to(ModuleState *state, PyObject *series, PyObject *value)
{
    if (Py_IS_TYPE(series, &HistogramType))
        return histogram_record((Histogram *)series, value);
    PyObject *done = PyObject_CallMethodOneArg(series, state->add, value);
    Py_XDECREF(done);
    return done == NULL ? -1 : 0;
}

static int add_double(ModuleState *state, PyObject *series, double value)
{
    if (Py_IS_TYPE(series, &HistogramType) && ((Histogram *)series)->counts != NULL) {
        histogram_put((Histogram *)series, value);
        return 0;
    }
    PyObject *boxed = PyFloat_FromDouble(value);
    if (boxed == NULL)
        return -1;
    const int done = add_to(state, series, boxed);
    Py_DECREF(boxed);
    return done;
}

/* ``cache.get(facts)`` or ``make(facts)`` (which keeps it in the cache), a tuple of ``size`` series: a new
 * reference; NULL with an error */
static PyObject *series_of(PyObject *cache, PyObject *make, PyObject *facts, Py_ssize_t size)
{
    PyObject *found = PyDict_GetItemWithError(cache, facts); /* borrowed */
    if (found != NULL)
        Py_INCREF(found);
    else if (PyErr_Occurred() || (found = PyObject_CallOneArg(make, facts)) == NULL)
        return NULL;
    if (!PyTuple_Check(found) || PyTuple_GET_SIZE(found) != size) {
        Py_DECREF(found);
        PyErr_Format(PyExc_TypeError, "a request's series must be a tuple of %zd", size);
        return NULL;
    }
    return found;
}

/* ``x or 0`` */
static PyObject *or_zero(PyObject *value, PyObject *zero)
{
    const int truth = truthy(value);
    return truth < 0 ? NULL : truth ? value : zero;
}

/* tracing.py's ``_metrics_py``: an attempt's client series, a request's server series */
static int record_metrics(Reader *r, PyObject *f, PyObject *trace, PyObject *attempts, long long end_ns,
                          PyObject *operation, int chat, PyObject *provider, PyObject *error_type, PyObject *hooks)
{
    ModuleState *state = r->state;
    PyObject *client_cache = PyTuple_GET_ITEM(hooks, 0), *server_cache = PyTuple_GET_ITEM(hooks, 1);
    PyObject *make_client = PyTuple_GET_ITEM(hooks, 2), *make_server = PyTuple_GET_ITEM(hooks, 3);
    const Py_ssize_t count = PyList_GET_SIZE(attempts);
    const int mark = r->count;
    for (Py_ssize_t n = 0; n < count; n++) {
        while (r->count > mark) /* the previous attempt's reads released (the list holds the attempts) */
            Py_DECREF(r->held[--r->count]);
        const int serving = n == count - 1;
        PyObject *attempt = PyList_GET_ITEM(attempts, n);
        PyObject *own_error = field(r, attempt, N_ERROR_TYPE);
        const int own_failure = truthy(own_error);
        if (own_failure < 0)
            return -1;
        PyObject *failed = own_failure ? own_error : serving ? error_type : state->empty;
        PyObject *response_model = serving ? field(r, f, N_RESPONSE_MODEL) : state->empty;
        PyObject *kind = field(r, attempt, N_PROVIDER_KIND), *model = field(r, attempt, N_MODEL);
        PyObject *url = field(r, attempt, N_URL);
        if (response_model == NULL || kind == NULL || model == NULL || url == NULL)
            return -1;
        PyObject *facts = PyTuple_Pack(6, operation, kind, model, response_model, url, failed);
        if (facts == NULL || hold(r, facts) < 0)
            return -1;
        PyObject *series = series_of(client_cache, make_client, facts, 3);
        if (series == NULL || hold(r, series) < 0)
            return -1;
        PyObject *start = field(r, attempt, N_START_NS), *end = field(r, attempt, N_END_NS);
        if (start == NULL || end == NULL)
            return -1;
        const long long start_ns = int64_of(start), own_end = int64_of(end);
        if ((start_ns == -1 || own_end == -1) && PyErr_Occurred())
            return -1;
        long long elapsed;
        if (__builtin_sub_overflow(own_end ? own_end : end_ns, start_ns, &elapsed)) {
            PyErr_SetString(PyExc_OverflowError, "an attempt's duration is outside int64");
            return -1;
        }
        if (add_double(state, PyTuple_GET_ITEM(series, 0), (double)elapsed / 1e9) < 0)
            return -1;
        if (!(serving && chat && !own_failure))
            continue;
        PyObject *usage = field(r, f, N_USAGE);
        if (usage == NULL)
            return -1;
        PyObject *input = field(r, usage, N_INPUT_TOKENS), *output = field(r, usage, N_OUTPUT_TOKENS);
        if (input == NULL || output == NULL)
            return -1;
        if (input == Py_None && output == Py_None)
            continue;
        PyObject *zero = PyLong_FromLong(0);
        if (zero == NULL || hold(r, zero) < 0)
            return -1;
        PyObject *read = or_zero(field(r, usage, N_CACHE_READ), zero);
        PyObject *created = or_zero(field(r, usage, N_CACHE_CREATION), zero);
        PyObject *in = or_zero(input, zero), *out = or_zero(output, zero);
        if (read == NULL || created == NULL || in == NULL || out == NULL)
            return -1;
        PyObject *partial = PyNumber_Add(in, read);
        if (partial == NULL || hold(r, partial) < 0)
            return -1;
        PyObject *total = PyNumber_Add(partial, created);
        if (total == NULL || hold(r, total) < 0)
            return -1;
        if (add_to(state, PyTuple_GET_ITEM(series, 1), total) < 0 ||
            add_to(state, PyTuple_GET_ITEM(series, 2), out) < 0)
            return -1;
    }
    if (!chat)
        return 0;
    PyObject *request_model = field(r, trace, N_REQUEST_MODEL), *response_model = field(r, f, N_RESPONSE_MODEL);
    if (request_model == NULL || response_model == NULL)
        return -1;
    PyObject *facts = PyTuple_Pack(4, provider, request_model, response_model, error_type);
    if (facts == NULL || hold(r, facts) < 0)
        return -1;
    PyObject *series = series_of(server_cache, make_server, facts, 2);
    if (series == NULL || hold(r, series) < 0)
        return -1;
    if (add_to(state, PyTuple_GET_ITEM(series, 0), field(r, f, N_DURATION)) < 0)
        return -1;
    PyObject *ttft = field(r, f, N_TTFT);
    const int failed = truthy(error_type);
    if (ttft == NULL || failed < 0)
        return -1;
    return ttft != Py_None && !failed ? add_to(state, PyTuple_GET_ITEM(series, 1), ttft) : 0;
}

/* tracing.py's ``_record_py``: one finished request's metrics and spans */
static int record_one(ModuleState *state, PyObject *item, int traces, PyObject *providers, PyObject *server,
                      PyObject *spans, PyObject *capture_build, PyObject *hooks)
{
    if (!PyTuple_Check(item) || PyTuple_GET_SIZE(item) != 3) {
        PyErr_SetString(PyExc_TypeError, "record(): each pending item is (finished, trace, end_ns)");
        return -1;
    }
    PyObject *f = PyTuple_GET_ITEM(item, 0), *trace = PyTuple_GET_ITEM(item, 1), *end = PyTuple_GET_ITEM(item, 2);
    Reader r;
    r.state = state;
    r.count = 0;
    r.last_type = NULL;
    int result = -1;
    PyObject *outcome = field(&r, f, N_OUTCOME), *attempts = field(&r, trace, N_ATTEMPTS_LIST);
    if (outcome == NULL || attempts == NULL)
        goto done;
    if (!PyList_Check(attempts)) {
        PyErr_SetString(PyExc_TypeError, "RequestTrace.attempts must be a list");
        goto done;
    }
    const int completed = PyUnicode_Check(outcome) && PyUnicode_CompareWithASCIIString(outcome, "completed") == 0;
    PyObject *error_type = state->empty;
    if (!completed) {
        PyObject *own = field(&r, trace, N_ERROR_TYPE);
        const int truth = truthy(own);
        if (truth < 0)
            goto done;
        error_type = truth ? own : outcome;
    }
    const Py_ssize_t count = PyList_GET_SIZE(attempts);
    PyObject *provider = state->empty;
    if (count) {
        PyObject *kind = field(&r, PyList_GET_ITEM(attempts, count - 1), N_PROVIDER_KIND);
        if (kind == NULL)
            goto done;
        PyObject *known = PyDict_GetItemWithError(providers, kind); /* borrowed */
        if (known == NULL && PyErr_Occurred())
            goto done;
        if (known != NULL)
            provider = known;
    }
    const int timed = truthy(field(&r, f, N_TIMED));
    if (timed < 0)
        goto done;
    PyObject *operation = timed ? state->chat : state->count_tokens;
    if (hooks != Py_None && count) {
        const int routed = truthy(field(&r, f, N_ROUTED));
        if (routed < 0)
            goto done;
        if (routed) {
            const long long end_ns = int64_of(end);
            if ((end_ns == -1 && PyErr_Occurred()) ||
                record_metrics(&r, f, trace, attempts, end_ns, operation, timed, provider, error_type, hooks) < 0)
                goto done;
        }
    }
    if (traces) {
        PyObject *flags = field(&r, trace, N_FLAGS);
        if (flags == NULL)
            goto done;
        const long sampled = PyLong_AsLong(flags);
        if (sampled == -1 && PyErr_Occurred())
            goto done;
        if (sampled & 1) {
            int answer = completed;
            if (!answer && (answer = truthy(field(&r, f, N_ATTEMPTS))) < 0)
                goto done;
            const int capture = truthy(field(&r, trace, N_CAPTURE));
            if (capture < 0)
                goto done;
            if (capture) {
                PyObject *call[] = {f, trace, end, operation, provider, error_type, answer ? Py_True : Py_False,
                                    providers, server, spans};
                PyObject *done = PyObject_Vectorcall(capture_build, call, 10, NULL);
                if (done == NULL)
                    goto done;
                Py_DECREF(done);
            }
            else {
                uint64_t end_ns;
                if (time_of(end, &end_ns) < 0 ||
                    spans_of(state, f, trace, end_ns, operation, provider, error_type, answer, providers, server,
                             spans) < 0)
                    goto done;
            }
        }
    }
    result = 0;
done:
    reader_release(&r);
    return result;
}

PyDoc_STRVAR(record_doc,
"record(pending, traces, providers, server, spans, capture_build, hooks, /)\n\n"
"tracing.py's ``_record_batch_py``, compiled: for each ``(finished, trace, end_ns)`` of ``pending``, its GenAI\n"
"metrics (``hooks``: None, or (client series cache, server series cache, make client series, make server\n"
"series)) and, when ``traces`` and the trace is sampled, its spans appended to ``spans`` (``capture_build``\n"
"writes those of a trace that captures content).");

static PyObject *record(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 7) {
        PyErr_Format(PyExc_TypeError, "record() takes exactly 7 arguments (%zd given)", nargs);
        return NULL;
    }
    PyObject *pending = args[0], *providers = args[2], *server = args[3], *spans = args[4], *hooks = args[6];
    if (!PyList_Check(pending) || !PyList_Check(spans) || !PyDict_Check(providers)) {
        PyErr_SetString(PyExc_TypeError, "record(): pending and spans must be lists, providers a dict");
        return NULL;
    }
    if (hooks != Py_None && (!PyTuple_Check(hooks) || PyTuple_GET_SIZE(hooks) != 4 ||
                             !PyDict_Check(PyTuple_GET_ITEM(hooks, 0)) || !PyDict_Check(PyTuple_GET_ITEM(hooks, 1)))) {
        PyErr_SetString(PyExc_TypeError, "record(): hooks must be None or (dict, dict, make client, make server)");
        return NULL;
    }
    const int traces = PyObject_IsTrue(args[1]);
    if (traces < 0)
        return NULL;
    ModuleState *state = module_state(module);
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(pending); i++) {
        PyObject *item = Py_NewRef(PyList_GET_ITEM(pending, i));
        const int done = record_one(state, item, traces, providers, server, spans, args[5], hooks);
        Py_DECREF(item);
        if (done < 0)
            return NULL;
    }
    Py_RETURN_NONE;
}

/* --- a request's trace and its attempts -------------------------------------------------------------------- */

PyDoc_STRVAR(bind_doc,
"bind(trace_type, attempt_type, getrandbits, /)\n\n"
"What ``new_trace`` and ``attempt`` make (tracing.RequestTrace, tracing.AttemptSpan) and draw their ids from\n"
"(``random.getrandbits``: the module's generator, reseeded in a forked child).");

static PyObject *bind(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3 || !PyType_Check(args[0]) || !PyType_Check(args[1]) || !PyCallable_Check(args[2])) {
        PyErr_SetString(PyExc_TypeError, "bind(trace_type, attempt_type, getrandbits)");
        return NULL;
    }
    ModuleState *state = module_state(module);
    Py_XSETREF(state->trace_type, Py_NewRef(args[0]));
    Py_XSETREF(state->attempt_type, Py_NewRef(args[1]));
    Py_XSETREF(state->getrandbits, Py_NewRef(args[2]));
    Py_RETURN_NONE;
}

/* ``getrandbits(8 * size)`` as ``size`` big-endian bytes; -1 with an error */
static int draw_bits(ModuleState *state, unsigned char *out, int size)
{
    if (state->getrandbits == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "_otlp_c: bind() was not called");
        return -1;
    }
    PyObject *bits = PyLong_FromLong(8L * size);
    if (bits == NULL)
        return -1;
    PyObject *drawn = PyObject_CallOneArg(state->getrandbits, bits);
    Py_DECREF(bits);
    if (drawn == NULL)
        return -1;
    if (!PyLong_Check(drawn)) {
        Py_DECREF(drawn);
        PyErr_SetString(PyExc_TypeError, "getrandbits() must return an int");
        return -1;
    }
    const int done = _PyLong_AsByteArray((PyLongObject *)drawn, out, (size_t)size, 0, 0);
    Py_DECREF(drawn);
    return done;
}

PyDoc_STRVAR(new_trace_doc,
"new_trace(bound, capture, /)\n\n"
"``Tracer.start``'s new trace (no caller's traceparent), as its Python code makes it: the trace id and the SERVER\n"
"span's from one draw of 192 bits (a span id of zeros made 1), sampled when the trace id's low 64 bits are\n"
"below ``bound`` (2**64: always), ``capture`` set on a sampled trace.");

static PyObject *new_trace(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_Format(PyExc_TypeError, "new_trace() takes exactly 2 arguments (%zd given)", nargs);
        return NULL;
    }
    ModuleState *state = module_state(module);
    if (!PyLong_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "new_trace(): the bound must be an int");
        return NULL;
    }
    int always = 0; /* a bound of 2**64 or more */
    unsigned long long bound = PyLong_AsUnsignedLongLong(args[0]);
    if (bound == (unsigned long long)-1 && PyErr_Occurred()) {
        if (!PyErr_ExceptionMatches(PyExc_OverflowError))
            return NULL;
        PyErr_Clear();
        always = _PyLong_Sign(args[0]) > 0; /* a negative bound: never */
        bound = 0;
    }
    const int capture = PyObject_IsTrue(args[1]);
    if (capture < 0)
        return NULL;
    unsigned char ids[24];
    if (draw_bits(state, ids, 24) < 0)
        return NULL;
    int zero = 1;
    for (int i = 16; i < 24; i++)
        zero &= ids[i] == 0;
    if (zero)
        ids[23] = 1;
    uint64_t sample = 0;
    for (int i = 8; i < 16; i++)
        sample = sample << 8 | ids[i];
    const int sampled = always || sample < bound;
    PyObject *trace_id = PyBytes_FromStringAndSize((const char *)ids, 16);
    PyObject *span_id = PyBytes_FromStringAndSize((const char *)ids + 16, 8);
    PyObject *parent = PyBytes_FromStringAndSize(NULL, 0);
    PyObject *flags = PyLong_FromLong(sampled ? 1 : 0);
    PyObject *trace = NULL;
    if (trace_id != NULL && span_id != NULL && parent != NULL && flags != NULL) {
        PyObject *call[] = {trace_id, parent, flags, state->empty, span_id};
        trace = PyObject_Vectorcall(state->trace_type, call, 5, NULL);
        if (trace != NULL && capture && sampled && PyObject_SetAttrString(trace, "capture", Py_True) < 0)
            Py_CLEAR(trace);
    }
    Py_XDECREF(trace_id);
    Py_XDECREF(span_id);
    Py_XDECREF(parent);
    Py_XDECREF(flags);
    return trace;
}

PyDoc_STRVAR(attempt_doc,
"attempt(trace, provider, provider_kind, model, /)\n\n"
"``RequestTrace.attempt``, compiled: a new attempt's span (its id from one draw of 64 bits, zeros made 1) with\n"
"its traceparent, appended to the trace's attempts.");

static PyObject *attempt(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4) {
        PyErr_Format(PyExc_TypeError, "attempt() takes exactly 4 arguments (%zd given)", nargs);
        return NULL;
    }
    ModuleState *state = module_state(module);
    Reader r;
    r.state = state;
    r.count = 0;
    r.last_type = NULL;
    PyObject *span = NULL;
    PyObject *trace = args[0];
    Py_ssize_t trace_length;
    const char *trace_id = bytes_of(field(&r, trace, N_TRACE_ID), &trace_length, "RequestTrace.trace_id");
    PyObject *flags = field(&r, trace, N_FLAGS), *attempts = field(&r, trace, N_ATTEMPTS_LIST);
    if (trace_id == NULL || flags == NULL || attempts == NULL)
        goto done;
    if (trace_length != 16) {
        PyErr_SetString(PyExc_ValueError, "RequestTrace.trace_id must be 16 bytes");
        goto done;
    }
    if (!PyList_Check(attempts) || !PyLong_Check(flags)) {
        PyErr_SetString(PyExc_TypeError, "RequestTrace: attempts must be a list, flags an int");
        goto done;
    }
    const long flag_bits = PyLong_AsLong(flags);
    if (flag_bits == -1 && PyErr_Occurred())
        goto done;
    unsigned char id[8];
    if (draw_bits(state, id, 8) < 0)
        goto done;
    if (!(id[0] | id[1] | id[2] | id[3] | id[4] | id[5] | id[6] | id[7]))
        id[7] = 1;
    static const char hex[] = "0123456789abcdef";
    char text[55]; /* 00-{32 hex}-{16 hex}-{2 hex} */
    char *p = text;
    *p++ = '0', *p++ = '0', *p++ = '-';
    for (Py_ssize_t i = 0; i < 16; i++)
        *p++ = hex[(unsigned char)trace_id[i] >> 4], *p++ = hex[(unsigned char)trace_id[i] & 15];
    *p++ = '-';
    for (int i = 0; i < 8; i++)
        *p++ = hex[id[i] >> 4], *p++ = hex[id[i] & 15];
    *p++ = '-';
    *p++ = hex[(flag_bits >> 4) & 15], *p++ = hex[flag_bits & 15];
    PyObject *span_id = PyBytes_FromStringAndSize((const char *)id, 8);
    PyObject *traceparent = PyUnicode_FromStringAndSize(text, p - text);
    if (span_id != NULL && traceparent != NULL) {
        PyObject *call[] = {span_id, args[1], args[2], args[3], traceparent};
        span = PyObject_Vectorcall(state->attempt_type, call, 5, NULL);
        if (span != NULL && PyList_Append(attempts, span) < 0)
            Py_CLEAR(span);
    }
    Py_XDECREF(span_id);
    Py_XDECREF(traceparent);
done:
    reader_release(&r);
    return span;
}

/* ``float(value) if type(value) is float or type(value) is int else None``: a new reference */
static PyObject *double_or_none(PyObject *value)
{
    if (value == NULL)
        return NULL;
    if (PyFloat_CheckExact(value))
        return Py_NewRef(value);
    if (PyLong_CheckExact(value)) {
        const double d = PyLong_AsDouble(value);
        return d == -1.0 && PyErr_Occurred() ? NULL : PyFloat_FromDouble(d);
    }
    return Py_NewRef(Py_None);
}

PyDoc_STRVAR(request_doc,
"request(trace, model, head, /)\n\n"
"``tracing._note_request_py``, compiled: the client's model and the parameters the\n"
"spans carry (from ``head``, a MessagesHead, or None) set on the trace; returns whether the trace captures\n"
"content (then the caller captures it).");

static PyObject *request(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3) {
        PyErr_Format(PyExc_TypeError, "request() takes exactly 3 arguments (%zd given)", nargs);
        return NULL;
    }
    ModuleState *state = module_state(module);
    PyObject *trace = args[0], *head = args[2];
    if (PyObject_SetAttr(trace, state->names[N_REQUEST_MODEL], args[1]) < 0)
        return NULL;
    Reader r;
    r.state = state;
    r.count = 0;
    r.last_type = NULL;
    PyObject *result = NULL;
    if (head != Py_None) {
        PyObject *stop = field(&r, head, N_STOP_SEQUENCES), *max_tokens = field(&r, head, N_MAX_TOKENS);
        if (stop == NULL || max_tokens == NULL)
            goto done;
        PyObject *stops = Py_None;
        if (PyList_CheckExact(stop)) {
            int all_text = 1;
            for (Py_ssize_t i = 0; i < PyList_GET_SIZE(stop) && all_text; i++)
                all_text = PyUnicode_CheckExact(PyList_GET_ITEM(stop, i));
            if (all_text && ((stops = PyList_AsTuple(stop)) == NULL || hold(&r, stops) < 0))
                goto done;
        }
        PyObject *params = PyTuple_New(5);
        if (params == NULL || hold(&r, params) < 0)
            goto done;
        PyTuple_SET_ITEM(params, 0, Py_NewRef(max_tokens));
        static const int names[] = {N_TEMPERATURE, N_TOP_P, N_TOP_K};
        for (int i = 0; i < 3; i++) {
            PyObject *number = double_or_none(field(&r, head, names[i]));
            if (number == NULL)
                goto done;
            PyTuple_SET_ITEM(params, i + 1, number);
        }
        PyTuple_SET_ITEM(params, 4, Py_NewRef(stops));
        if (PyObject_SetAttr(trace, state->names[N_PARAMS], params) < 0)
            goto done;
    }
    const int capture = truthy(field(&r, trace, N_CAPTURE));
    if (capture >= 0)
        result = Py_NewRef(capture ? Py_True : Py_False);
done:
    reader_release(&r);
    return result;
}

PyDoc_STRVAR(set_aside_doc,
"set_aside(pending, finished, metrics, traces, /)\n\n"
"``Tracer.record``'s setting aside, compiled: a traced request's ``(finished, its trace, the time now in ns)``\n"
"appended to ``pending`` when there is anything to build of it (its metrics, or its spans when sampled);\n"
"returns the number pending (0: not traced, nothing set aside).");

static PyObject *set_aside(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4 || !PyList_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "set_aside(pending: list, finished, metrics, traces)");
        return NULL;
    }
    Reader r;
    r.state = module_state(module);
    r.count = 0;
    r.last_type = NULL;
    PyObject *result = NULL;
    PyObject *trace = field(&r, args[1], N_TRACE);
    const int metrics = PyObject_IsTrue(args[2]), traces = PyObject_IsTrue(args[3]);
    if (trace == NULL || metrics < 0 || traces < 0)
        goto done;
    if (trace == Py_None) {
        result = PyLong_FromLong(0);
        goto done;
    }
    if (!metrics) {
        long flags = 0;
        if (traces) {
            PyObject *value = field(&r, trace, N_FLAGS);
            if (value == NULL || ((flags = PyLong_AsLong(value)) == -1 && PyErr_Occurred()))
                goto done;
        }
        if (!(flags & 1)) {
            result = PyLong_FromLong(0);
            goto done;
        }
    }
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now); /* time.time_ns()'s clock */
    PyObject *end = PyLong_FromLongLong((long long)now.tv_sec * 1000000000LL + now.tv_nsec);
    if (end == NULL)
        goto done;
    PyObject *item = PyTuple_Pack(3, args[1], trace, end);
    Py_DECREF(end);
    if (item == NULL)
        goto done;
    const int appended = PyList_Append(args[0], item);
    Py_DECREF(item);
    if (appended == 0)
        result = PyLong_FromSsize_t(PyList_GET_SIZE(args[0]));
done:
    reader_release(&r);
    return result;
}

/* --- the module ---------------------------------------------------------------------------------------- */

static PyMethodDef methods[] = {
    {"attributes", (PyCFunction)(void (*)(void))attributes, METH_FASTCALL, attributes_doc},
    {"span", (PyCFunction)(void (*)(void))span, METH_FASTCALL, span_doc},
    {"request_spans", (PyCFunction)(void (*)(void))request_spans, METH_FASTCALL, request_spans_doc},
    {"record", (PyCFunction)(void (*)(void))record, METH_FASTCALL, record_doc},
    {"bind", (PyCFunction)(void (*)(void))bind, METH_FASTCALL, bind_doc},
    {"new_trace", (PyCFunction)(void (*)(void))new_trace, METH_FASTCALL, new_trace_doc},
    {"attempt", (PyCFunction)(void (*)(void))attempt, METH_FASTCALL, attempt_doc},
    {"request", (PyCFunction)(void (*)(void))request, METH_FASTCALL, request_doc},
    {"set_aside", (PyCFunction)(void (*)(void))set_aside, METH_FASTCALL, set_aside_doc},
    {NULL, NULL, 0, NULL},
};

static int exec_module(PyObject *module)
{
    PyObject *struct_module = PyImport_ImportModule("struct");
    if (struct_module == NULL)
        return -1;
    ModuleState *state = module_state(module);
    state->struct_error = PyObject_GetAttrString(struct_module, "error");
    Py_DECREF(struct_module);
    if (state->struct_error == NULL)
        return -1;
    for (int i = 0; i < N_COUNT; i++) {
        if ((state->names[i] = PyUnicode_InternFromString(NAMES[i])) == NULL)
            return -1;
    }
    if ((state->chat = PyUnicode_InternFromString("chat")) == NULL ||
        (state->count_tokens = PyUnicode_InternFromString("count_tokens")) == NULL ||
        (state->empty = PyUnicode_InternFromString("")) == NULL ||
        (state->add = PyUnicode_InternFromString("add")) == NULL)
        return -1;
    if (PyType_Ready(&HistogramType) < 0)
        return -1;
    return PyModule_AddObjectRef(module, "Histogram", (PyObject *)&HistogramType);
}

static int module_traverse(PyObject *module, visitproc visit, void *arg)
{
    Py_VISIT(module_state(module)->struct_error);
    for (int i = 0; i < N_COUNT; i++)
        Py_VISIT(module_state(module)->names[i]);
    for (int i = 0; i < module_state(module)->layout_count; i++)
        Py_VISIT(module_state(module)->layouts[i].type);
    Py_VISIT(module_state(module)->chat);
    Py_VISIT(module_state(module)->count_tokens);
    Py_VISIT(module_state(module)->empty);
    Py_VISIT(module_state(module)->add);
    Py_VISIT(module_state(module)->trace_type);
    Py_VISIT(module_state(module)->attempt_type);
    Py_VISIT(module_state(module)->getrandbits);
    Py_VISIT(module_state(module)->last_server);
    Py_VISIT(module_state(module)->last_url);
    Py_VISIT(module_state(module)->last_where);
    return 0;
}

static int module_clear(PyObject *module)
{
    Py_CLEAR(module_state(module)->struct_error);
    for (int i = 0; i < N_COUNT; i++)
        Py_CLEAR(module_state(module)->names[i]);
    for (int i = 0; i < module_state(module)->layout_count; i++)
        Py_CLEAR(module_state(module)->layouts[i].type);
    module_state(module)->layout_count = 0;
    Py_CLEAR(module_state(module)->chat);
    Py_CLEAR(module_state(module)->count_tokens);
    Py_CLEAR(module_state(module)->empty);
    Py_CLEAR(module_state(module)->add);
    Py_CLEAR(module_state(module)->trace_type);
    Py_CLEAR(module_state(module)->attempt_type);
    Py_CLEAR(module_state(module)->getrandbits);
    Py_CLEAR(module_state(module)->last_server);
    Py_CLEAR(module_state(module)->last_url);
    Py_CLEAR(module_state(module)->last_where);
    return 0;
}

static void module_free(void *module) { module_clear((PyObject *)module); }

static PyModuleDef_Slot slots[] = {
    {Py_mod_exec, exec_module},
    {0, NULL},
};

static struct PyModuleDef moduledef = {
    PyModuleDef_HEAD_INIT,
    .m_name = "gateway.observability._otlp_c",
    .m_doc = "The OTLP encoder's attributes and spans, compiled (see gateway/observability/otlp_proto.py).",
    .m_size = sizeof(ModuleState),
    .m_methods = methods,
    .m_slots = slots,
    .m_traverse = module_traverse,
    .m_clear = module_clear,
    .m_free = module_free,
};

PyMODINIT_FUNC PyInit__otlp_c(void)
{
    return PyModuleDef_Init(&moduledef);
}
