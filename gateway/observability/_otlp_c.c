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
 * Optional: setup.py builds it when a C compiler is there. Nothing but the CPython C API.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

/* The largest body this module measures: far enough below PY_SSIZE_T_MAX that adding a field's header
 * (at most 11 bytes) and one more field's size to a size under it never overflows. */
#define SIZE_LIMIT (PY_SSIZE_T_MAX / 4)
/* Attributes measured into records on the stack, more into PyMem */
#define STACK_ATTRIBUTES 32

typedef struct {
    PyObject *struct_error; /* struct.error: what struct.pack raises for a time that is not a uint64 */
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
    const char *trace_id, *span_id, *parent, *trace_state, *name, *message, *raw = NULL;
    Py_ssize_t trace_id_length, span_id_length, parent_length, trace_state_length, name_length, message_length;
    Py_ssize_t raw_length = 0;
    int has_kind, has_start, has_end, has_code;
    uint64_t kind, start, end, code;
    /* Every argument converted (Python code may run: __bool__, __index__, a mapping's items()) before
     * anything is measured */
    if (bytes_argument(args[0], "trace_id", 0, &trace_id, &trace_id_length) < 0 ||
        bytes_argument(args[1], "span_id", 0, &span_id, &span_id_length) < 0 ||
        bytes_argument(args[2], "parent_span_id", 1, &parent, &parent_length) < 0 ||
        text_argument(args[3], "trace_state", &trace_state, &trace_state_length) < 0 ||
        text_argument(args[4], "name", &name, &name_length) < 0 ||
        enum_argument(args[5], "kind", &has_kind, &kind) < 0 ||
        time_argument(state, args[6], &has_start, &start) < 0 ||
        time_argument(state, args[7], &has_end, &end) < 0 ||
        enum_argument(args[9], "status_code", &has_code, &code) < 0 ||
        text_argument(args[10], "status_message", &message, &message_length) < 0)
        return NULL;
    if (!PyLong_Check(args[11])) {
        PyErr_Format(PyExc_TypeError, "span(): flags must be int, not %.100s", Py_TYPE(args[11])->tp_name);
        return NULL;
    }
    /* flags (16): the W3C trace flags, SPAN_FLAGS_CONTEXT_HAS_IS_REMOTE_MASK, and
     * SPAN_FLAGS_CONTEXT_IS_REMOTE_MASK when the span has a parent and that parent is remote */
    uint32_t flags = (uint32_t)(PyLong_AsUnsignedLongLongMask(args[11]) & 0xFF) | 0x100;
    if (PyErr_Occurred())
        return NULL;
    const int remote = PyObject_IsTrue(args[12]);
    if (remote < 0)
        return NULL;
    if (remote && parent_length)
        flags |= 0x200;
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
    Py_ssize_t status = 0, size = 0, n;
    if (message_length) {
        if ((status = field_size(message_length)) < 0)
            goto done;
    }
    if (has_code)
        status += 1 + varint_size(code);
    const Py_ssize_t lengths[] = {trace_id_length, span_id_length, trace_state_length, parent_length, name_length};
    for (size_t i = 0; i < sizeof lengths / sizeof lengths[0]; i++) {
        if (lengths[i]) {
            if ((n = field_size(lengths[i])) < 0)
                goto done;
            size += n;
        }
    }
    size += (has_kind ? 1 + varint_size(kind) : 0) + (has_start ? 9 : 0) + (has_end ? 9 : 0);
    if (raw_length > SIZE_LIMIT || a.size > SIZE_LIMIT || (n = field_size(status)) < 0) {
        too_large();
        goto done;
    }
    size += raw_length + a.size + n + 6;
    if (size > SIZE_LIMIT) {
        too_large();
        goto done;
    }
    if ((result = PyBytes_FromStringAndSize(NULL, size)) == NULL)
        goto done;

    char *p = PyBytes_AS_STRING(result);
    if (trace_id_length)
        p = put_field(p, 0x0a, trace_id, trace_id_length); /* trace_id (1) */
    if (span_id_length)
        p = put_field(p, 0x12, span_id, span_id_length); /* span_id (2) */
    if (trace_state_length)
        p = put_field(p, 0x1a, trace_state, trace_state_length); /* trace_state (3) */
    if (parent_length)
        p = put_field(p, 0x22, parent, parent_length); /* parent_span_id (4) */
    if (name_length)
        p = put_field(p, 0x2a, name, name_length); /* name (5) */
    if (has_kind) {
        *p++ = 0x30; /* kind (6), enum */
        p = put_varint(p, kind);
    }
    if (has_start) {
        *p++ = 0x39; /* start_time_unix_nano (7), fixed64 */
        p = put_fixed64(p, start);
    }
    if (has_end) {
        *p++ = 0x41; /* end_time_unix_nano (8), fixed64 */
        p = put_fixed64(p, end);
    }
    if (raw_length) { /* attributes (9): the bytes encode_attributes made of them */
        memcpy(p, raw, (size_t)raw_length);
        p += raw_length;
    }
    else if (a.count && (p = put_attributes(p, &a, 0x4a)) == NULL) /* attributes (9) */
        goto written;
    *p++ = 0x7a; /* status (15), always (the SDK sets it): Status{message (2), code (3)} */
    p = put_varint(p, (uint64_t)status);
    if (message_length)
        p = put_field(p, 0x12, message, message_length);
    if (has_code) {
        *p++ = 0x18;
        p = put_varint(p, code);
    }
    *p++ = (char)0x85; /* flags (16), fixed32 */
    *p++ = 0x01;
    p = put_fixed32(p, flags);
written:
    result = finished(result, p);
done:
    attributes_release(&a);
    return result;
}

/* --- the module ---------------------------------------------------------------------------------------- */

static PyMethodDef methods[] = {
    {"attributes", (PyCFunction)(void (*)(void))attributes, METH_FASTCALL, attributes_doc},
    {"span", (PyCFunction)(void (*)(void))span, METH_FASTCALL, span_doc},
    {NULL, NULL, 0, NULL},
};

static int exec_module(PyObject *module)
{
    PyObject *struct_module = PyImport_ImportModule("struct");
    if (struct_module == NULL)
        return -1;
    module_state(module)->struct_error = PyObject_GetAttrString(struct_module, "error");
    Py_DECREF(struct_module);
    return module_state(module)->struct_error == NULL ? -1 : 0;
}

static int module_traverse(PyObject *module, visitproc visit, void *arg)
{
    Py_VISIT(module_state(module)->struct_error);
    return 0;
}

static int module_clear(PyObject *module)
{
    Py_CLEAR(module_state(module)->struct_error);
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
