/* The readers' C kernels, run without holding Python's GIL so that the reader threads encode
 * blocks side by side: FarmHash's Fingerprint64 of binary values lying in Arrow's buffers, a
 * dictionary's ids taken by its indices, the insert and probe of the vocabulary's key table,
 * blocks of delimited lines parsed, checked and encoded, and the vocabulary pass's counting of
 * (field, value) fingerprints. Python owns every array; these functions only read and write the
 * buffers they are given (tfscale/data/fingerprint.py, tfscale/data/parquet_columns.py,
 * tfscale/data/key_table.py, tfscale/data/line_kernel.py, tfscale/data/value_counts.py).
 *
 * Ours because TensorFlow hashes only tf.string tensors, whose making costs more than the
 * hashing, and numpy has no hash table (docs/results/input_path.md). Fingerprint64 is
 * farmhashna::Hash64 (TensorFlow's `Fingerprint64`, `to_hash_bucket_fast`'s hash);
 * tests/test_fingerprint.py checks it against TensorFlow's op bit for bit.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "FarmHash reads little-endian words; this kernel is written for little-endian machines"
#endif

static const uint64_t K0 = 0xc3a5c85c97cb3127ULL;
static const uint64_t K1 = 0xb492b66fbe98f273ULL;
static const uint64_t K2 = 0x9ae16a3b2f90404fULL;

static inline uint64_t fetch64(const uint8_t *p) {
  uint64_t word;
  memcpy(&word, p, sizeof word);
  return word;
}

static inline uint64_t fetch32(const uint8_t *p) {
  uint32_t word;
  memcpy(&word, p, sizeof word);
  return word;
}

static inline uint64_t rotate(uint64_t value, int shift) {
  return (value >> shift) | (value << (64 - shift));
}

static inline uint64_t shift_mix(uint64_t value) { return value ^ (value >> 47); }

static inline uint64_t hash_len16(uint64_t u, uint64_t v, uint64_t mul) {
  uint64_t a = (u ^ v) * mul;
  a ^= a >> 47;
  uint64_t b = (v ^ a) * mul;
  b ^= b >> 47;
  return b * mul;
}

static inline __attribute__((always_inline)) uint64_t hash_len0to16(const uint8_t *s,
                                                                    uint64_t len) {
  if (len >= 8) {
    uint64_t mul = K2 + len * 2;
    uint64_t a = fetch64(s) + K2;
    uint64_t b = fetch64(s + len - 8);
    uint64_t c = rotate(b, 37) * mul + a;
    uint64_t d = (rotate(a, 25) + b) * mul;
    return hash_len16(c, d, mul);
  }
  if (len >= 4) {
    uint64_t mul = K2 + len * 2;
    uint64_t a = fetch32(s);
    return hash_len16(len + (a << 3), fetch32(s + len - 4), mul);
  }
  if (len > 0) {
    uint32_t y = (uint32_t)s[0] + ((uint32_t)s[len >> 1] << 8);
    uint32_t z = (uint32_t)len + ((uint32_t)s[len - 1] << 2);
    return shift_mix(y * K2 ^ z * K0) * K2;
  }
  return K2;
}

static uint64_t hash_len17to32(const uint8_t *s, uint64_t len) {
  uint64_t mul = K2 + len * 2;
  uint64_t a = fetch64(s) * K1;
  uint64_t b = fetch64(s + 8);
  uint64_t c = fetch64(s + len - 8) * mul;
  uint64_t d = fetch64(s + len - 16) * K2;
  return hash_len16(rotate(a + b, 43) + rotate(c, 30) + d, a + rotate(b + K2, 18) + c, mul);
}

static uint64_t hash_len33to64(const uint8_t *s, uint64_t len) {
  uint64_t mul = K2 + len * 2;
  uint64_t a = fetch64(s) * K2;
  uint64_t b = fetch64(s + 8);
  uint64_t c = fetch64(s + len - 8) * mul;
  uint64_t d = fetch64(s + len - 16) * K2;
  uint64_t y = rotate(a + b, 43) + rotate(c, 30) + d;
  uint64_t z = hash_len16(y, a + rotate(b + K2, 18) + c, mul);
  uint64_t e = fetch64(s + 16) * mul;
  uint64_t f = fetch64(s + 24);
  uint64_t g = (y + fetch64(s + len - 32)) * mul;
  uint64_t h = (z + fetch64(s + len - 24)) * mul;
  return hash_len16(rotate(e + f, 43) + rotate(g, 30) + h, e + rotate(f + a, 18) + g, mul);
}

/* WeakHashLen32WithSeeds of the 32 bytes at s, seeds a and b, into (*first, *second). */
static inline void weak_hash_len32(const uint8_t *s, uint64_t a, uint64_t b, uint64_t *first,
                                   uint64_t *second) {
  uint64_t w = fetch64(s), x = fetch64(s + 8), y = fetch64(s + 16), z = fetch64(s + 24);
  a += w;
  b = rotate(b + a + z, 21);
  uint64_t c = a;
  a += x;
  a += y;
  b += rotate(a, 44);
  *first = a + z;
  *second = b + c;
}

static uint64_t hash_long(const uint8_t *s, uint64_t len) {
  const uint64_t seed = 81;
  uint64_t x = seed, y = seed * K1 + 113, z = shift_mix(y * K2 + 113) * K2;
  uint64_t v0 = 0, v1 = 0, w0 = 0, w1 = 0, swap;
  x = x * K2 + fetch64(s);
  const uint8_t *end = s + ((len - 1) / 64) * 64;
  const uint8_t *last64 = end + ((len - 1) & 63) - 63;
  do {
    x = rotate(x + y + v0 + fetch64(s + 8), 37) * K1;
    y = rotate(y + v1 + fetch64(s + 48), 42) * K1;
    x ^= w1;
    y += v0 + fetch64(s + 40);
    z = rotate(z + w0, 33) * K1;
    weak_hash_len32(s, v1 * K1, x + w0, &v0, &v1);
    weak_hash_len32(s + 32, z + w1, y + fetch64(s + 16), &w0, &w1);
    swap = z, z = x, x = swap;
    s += 64;
  } while (s != end);
  uint64_t mul = K1 + ((z & 0xff) << 1);
  s = last64;
  w0 += (len - 1) & 63;
  v0 += w0;
  w0 += v0;
  x = rotate(x + y + v0 + fetch64(s + 8), 37) * mul;
  y = rotate(y + v1 + fetch64(s + 48), 42) * mul;
  x ^= w1 * 9;
  y += v0 * 9 + fetch64(s + 40);
  z = rotate(z + w0, 33) * mul;
  weak_hash_len32(s, v1 * mul, x + w0, &v0, &v1);
  weak_hash_len32(s + 32, z + w1, y + fetch64(s + 16), &w0, &w1);
  swap = z, z = x, x = swap;
  return hash_len16(hash_len16(v0, w0, mul) + shift_mix(y) * K0 + z,
                    hash_len16(v1, w1, mul) + x, mul);
}

static __attribute__((noinline)) uint64_t fingerprint_over16(const uint8_t *s, uint64_t len) {
  if (len <= 32) return hash_len17to32(s, len);
  if (len <= 64) return hash_len33to64(s, len);
  return hash_long(s, len);
}

/* Inlined for the short values most categorical fields hold; longer ones through a call. */
static inline __attribute__((always_inline)) uint64_t fingerprint64(const uint8_t *s,
                                                                    uint64_t len) {
  return len <= 16 ? hash_len0to16(s, len) : fingerprint_over16(s, len);
}

/* ------------------------------------------------------------------------------- buffers */

/* A buffer of the Python object `object`, C-contiguous, of `itemsize` bytes an item (0: any),
 * writable when asked; an error naming `what` otherwise. */
static int get_buffer(PyObject *object, Py_buffer *view, Py_ssize_t itemsize, int writable,
                      const char *what) {
  int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0);
  if (PyObject_GetBuffer(object, view, flags) < 0) return -1;
  if (itemsize && view->itemsize != itemsize) {
    PyErr_Format(PyExc_TypeError, "%s must hold %zd-byte items, not %zd-byte ones", what,
                 itemsize, view->itemsize);
    PyBuffer_Release(view);
    return -1;
  }
  return 0;
}

/* A writable one-dimensional int64 output, strided (a column of a C-ordered [n, C] array). */
typedef struct {
  Py_buffer view;
  char *at;
  Py_ssize_t count, stride;
} Output;

static int get_output(PyObject *object, Output *out) {
  if (PyObject_GetBuffer(object, &out->view, PyBUF_STRIDES | PyBUF_FORMAT | PyBUF_WRITABLE) < 0)
    return -1;
  if (out->view.ndim != 1 || out->view.itemsize != 8) {
    PyErr_SetString(PyExc_TypeError, "out must be one-dimensional, of 8-byte items");
    PyBuffer_Release(&out->view);
    return -1;
  }
  out->at = out->view.buf;
  out->count = out->view.shape[0];
  out->stride = out->view.strides[0];
  return 0;
}

static inline void put(Output *out, Py_ssize_t i, int64_t value) {
  *(int64_t *)(out->at + i * out->stride) = value;
}

/* Whether bit `bit` of Arrow validity bitmap `bits` is set (NULL: every value is valid). */
static inline int is_valid(const uint8_t *bits, int64_t bit) {
  return !bits || (bits[bit >> 3] >> (bit & 7)) & 1;
}

/* The validity bitmap `object` (None: no nulls) as a buffer holding bits [first, first + count),
 * or -1 with a Python error. */
static int get_validity(PyObject *object, Py_buffer *view, int64_t first, Py_ssize_t count,
                        const uint8_t **bits) {
  *bits = NULL;
  if (object == Py_None) return 0;
  if (get_buffer(object, view, 0, 0, "validity") < 0) return -1;
  if (first < 0 || view->len * 8 < first + count) {
    PyErr_SetString(PyExc_ValueError, "validity holds fewer bits than the values");
    PyBuffer_Release(view);
    return -1;
  }
  *bits = view->buf;
  return 0;
}

/* The values of an Arrow binary array as its buffers: the bytes, the offsets (int32 or int64:
 * binary or large binary, count + 1 of them, from the array's own offset on) and the validity
 * bitmap (None: no nulls) whose bit `first` is the first value's. */
typedef struct {
  Py_buffer data, offsets, validity;
  const uint8_t *bits;
  int64_t first;
  Py_ssize_t count;
} Values;

static int get_values(PyObject *data, PyObject *offsets, PyObject *validity, long long first,
                      Values *values) {
  if (get_buffer(data, &values->data, 0, 0, "data") < 0) return -1;
  if (get_buffer(offsets, &values->offsets, 0, 0, "offsets") < 0) goto no_offsets;
  Py_ssize_t size = values->offsets.itemsize;
  if ((size != 4 && size != 8) || values->offsets.len < size) {
    PyErr_SetString(PyExc_TypeError, "offsets must be int32 or int64, at least one of them");
    goto bad_offsets;
  }
  values->count = values->offsets.len / size - 1;
  values->first = first;
  if (get_validity(validity, &values->validity, first, values->count, &values->bits) < 0)
    goto bad_offsets;
  return 0;
bad_offsets:
  PyBuffer_Release(&values->offsets);
no_offsets:
  PyBuffer_Release(&values->data);
  return -1;
}

static void release_values(Values *values) {
  if (values->bits) PyBuffer_Release(&values->validity);
  PyBuffer_Release(&values->offsets);
  PyBuffer_Release(&values->data);
}

/* The values' buffers as plain pointers, passed by value into the loops that read them: the
 * compiler then keeps them in registers, where it must reload a Py_buffer's fields after every
 * write to an output it cannot tell apart from them. `wide`: int64 offsets, else int32. */
typedef struct {
  const uint8_t *data, *bits;
  const void *offsets;
  int64_t size, first;
  Py_ssize_t count;
  int wide;
} Column;

static Column column_of(const Values *values) {
  Column column = {.data = values->data.buf, .bits = values->bits,
                   .offsets = values->offsets.buf, .size = values->data.len,
                   .first = values->first, .count = values->count,
                   .wide = values->offsets.itemsize == 8};
  return column;
}

/* Fingerprint64 of value i into *hash: 1 when it is present, 0 when null or empty, -1 when its
 * offsets lie outside the bytes. */
static inline __attribute__((always_inline)) int fingerprint_at(Column column, Py_ssize_t i,
                                                                uint64_t *hash) {
  int64_t start, stop;
  if (column.wide) {
    start = ((const int64_t *)column.offsets)[i];
    stop = ((const int64_t *)column.offsets)[i + 1];
  } else {
    start = ((const int32_t *)column.offsets)[i];
    stop = ((const int32_t *)column.offsets)[i + 1];
  }
  if (!is_valid(column.bits, column.first + i) || stop == start) return 0;
  if (start < 0 || stop < start || stop > column.size) return -1;
  *hash = fingerprint64(column.data + start, (uint64_t)(stop - start));
  return 1;
}

static const char OUTSIDE_DATA[] = "an offset lies outside data";

/* A fingerprint modulo 2**63 - 1, as `to_hash_bucket_fast(2**63 - 1)` gives it: 2**63 is 1. */
static inline uint64_t within_hash_range(uint64_t hash) {
  const uint64_t range = 0x7fffffffffffffffULL;
  uint64_t folded = (hash & range) + (hash >> 63);
  return folded >= range ? folded - range : folded;
}

/* a % d for any uint64 a, by a multiplication with `reciprocal_of(d)` instead of a division
 * (Lemire, Kaser and Kurz, "Faster remainder by direct computation", 2019: exact for 64-bit
 * operands with a 128-bit reciprocal). */
static inline __uint128_t reciprocal_of(uint64_t d) { return ~(__uint128_t)0 / d + 1; }

static inline uint64_t remainder_of(uint64_t a, __uint128_t reciprocal, uint64_t d) {
  __uint128_t fraction = reciprocal * a;
  __uint128_t low = ((fraction & UINT64_MAX) * d) >> 64;
  return (uint64_t)((low + (fraction >> 64) * d) >> 64);
}

/* ------------------------------------------------------------------------------ key table */

/* A key table: `slots` int64 [size, 2] of (key, id) and `tags` uint8 [size], size a power of
 * two and a multiple of GROUP; an empty slot's tag is 0, an occupied one's 0x80 | the key's bits
 * 56-62 (keys are never negative). A key lies, by linear probing, in the first slot free at its
 * insertion from the start of its home group (key & mask, rounded down to a multiple of GROUP);
 * no key is ever removed, so a key lies before the first empty slot after its group's start,
 * and a group holding an empty slot ends a search. A group's GROUP tags are one 64-bit word,
 * compared at once (SWAR): a search reads the slots only of tags that match, so a key the table
 * does not hold (most of a vocabulary's lookups) costs a read of the tags alone, which stay in
 * cache where the slots do not. */
#define GROUP 8
static const uint64_t ONES = 0x0101010101010101ULL, HIGHS = 0x8080808080808080ULL;

/* The high bit of each zero byte of `word` set (and, above a zero byte, perhaps of a byte that
 * is not: exact as a test of whether any byte is zero, and as the lowest zero byte). */
static inline uint64_t zero_bytes(uint64_t word) { return (word - ONES) & ~word & HIGHS; }

static inline uint64_t tag_of(int64_t key) { return 0x80 | ((uint64_t)key >> 56); }

typedef struct {
  Py_buffer view, tags_view;
} Table;

/* A table's arrays as plain values, passed into the loops that probe it (see Column). */
typedef struct {
  int64_t *slots, mask;
  uint8_t *tags;
} Probe;

static int get_table(PyObject *slots, PyObject *tags, Table *table, Probe *probe,
                     int writable) {
  if (get_buffer(slots, &table->view, 8, writable, "slots") < 0) return -1;
  if (get_buffer(tags, &table->tags_view, 1, writable, "tags") < 0) {
    PyBuffer_Release(&table->view);
    return -1;
  }
  Py_ssize_t size = table->view.len / 16;
  if (size < GROUP || (size & (size - 1)) || table->view.len != size * 16 ||
      table->tags_view.len != size) {
    PyErr_SetString(PyExc_ValueError,
                    "slots must be int64 [size, 2] and tags uint8 [size], size a power of two "
                    ">= 8");
    PyBuffer_Release(&table->tags_view);
    PyBuffer_Release(&table->view);
    return -1;
  }
  probe->slots = table->view.buf;
  probe->tags = table->tags_view.buf;
  probe->mask = size - 1;
  return 0;
}

static void release_table(Table *table) {
  PyBuffer_Release(&table->tags_view);
  PyBuffer_Release(&table->view);
}

static inline uint64_t group_tags(Probe probe, int64_t group) {
  uint64_t tags;
  memcpy(&tags, probe.tags + group, sizeof tags);
  return tags;
}

/* The slot of `key` (>= 0), or -1 - the first empty slot where it would go. */
static inline int64_t slot_of(Probe probe, int64_t key) {
  uint64_t wanted = tag_of(key) * ONES;
  int64_t group = key & probe.mask & ~(int64_t)(GROUP - 1);
  for (;;) {
    uint64_t tags = group_tags(probe, group);
    for (uint64_t found = zero_bytes(tags ^ wanted); found; found &= found - 1) {
      int64_t slot = group + (__builtin_ctzll(found) >> 3);
      if (probe.slots[2 * slot] == key) return slot;
    }
    uint64_t empty = zero_bytes(tags);
    if (empty) return -1 - (group + (__builtin_ctzll(empty) >> 3));
    group = (group + GROUP) & probe.mask;
  }
}

/* The id of `key` (>= 0), or `absent`. */
static inline int64_t id_of(Probe probe, int64_t key, int64_t absent) {
  int64_t slot = slot_of(probe, key);
  return slot >= 0 ? probe.slots[2 * slot + 1] : absent;
}

/* insert(slots, tags, keys, ids): each key (>= 0) in order with its id into the first free slot
 * from its group's start on, unless the table holds it already (its first id is kept). The
 * caller keeps the table under half full. */
static PyObject *insert(PyObject *self, PyObject *args) {
  PyObject *slots_object, *tags_object, *keys_object, *ids_object;
  if (!PyArg_ParseTuple(args, "OOOO", &slots_object, &tags_object, &keys_object, &ids_object))
    return NULL;
  Table table;
  Probe probe;
  Py_buffer keys, ids;
  if (get_table(slots_object, tags_object, &table, &probe, 1) < 0) return NULL;
  if (get_buffer(keys_object, &keys, 8, 0, "keys") < 0) goto no_keys;
  if (get_buffer(ids_object, &ids, 8, 0, "ids") < 0) goto no_ids;
  if (ids.len != keys.len) {
    PyErr_SetString(PyExc_ValueError, "keys and ids must be of one length");
    goto bad;
  }
  const int64_t *key = keys.buf, *id = ids.buf;
  Py_ssize_t count = keys.len / 8;
  Py_BEGIN_ALLOW_THREADS
  for (Py_ssize_t i = 0; i < count; ++i) {
    int64_t slot = slot_of(probe, key[i]);
    if (slot < 0) {
      slot = -1 - slot;
      probe.tags[slot] = (uint8_t)tag_of(key[i]);
      probe.slots[2 * slot] = key[i];
      probe.slots[2 * slot + 1] = id[i];
    }
  }
  Py_END_ALLOW_THREADS
bad:
  PyBuffer_Release(&ids);
no_ids:
  PyBuffer_Release(&keys);
no_keys:
  release_table(&table);
  if (PyErr_Occurred()) return NULL;
  Py_RETURN_NONE;
}

/* lookup(slots, tags, keys, absent, out): out[i] = the id of keys[i] (>= 0), or `absent` when
 * the table does not hold it. */
static PyObject *lookup(PyObject *self, PyObject *args) {
  PyObject *slots_object, *tags_object, *keys_object, *out_object;
  long long absent;
  if (!PyArg_ParseTuple(args, "OOOLO", &slots_object, &tags_object, &keys_object, &absent,
                        &out_object))
    return NULL;
  Table table;
  Probe probe;
  Py_buffer keys;
  Output out;
  if (get_table(slots_object, tags_object, &table, &probe, 0) < 0) return NULL;
  if (get_buffer(keys_object, &keys, 8, 0, "keys") < 0) goto no_keys;
  if (get_output(out_object, &out) < 0) goto no_out;
  if (out.count != keys.len / 8) {
    PyErr_SetString(PyExc_ValueError, "keys and out must be of one length");
    goto bad;
  }
  const int64_t *key = keys.buf;
  char *at = out.at;
  Py_ssize_t stride = out.stride, count = out.count;
  Py_BEGIN_ALLOW_THREADS
  for (Py_ssize_t i = 0; i < count; ++i)
    *(int64_t *)(at + i * stride) = key[i] < 0 ? absent : id_of(probe, key[i], absent);
  Py_END_ALLOW_THREADS
bad:
  PyBuffer_Release(&out.view);
no_out:
  PyBuffer_Release(&keys);
no_keys:
  release_table(&table);
  if (PyErr_Occurred()) return NULL;
  Py_RETURN_NONE;
}

/* -------------------------------------------------------------------------- values to ids */

/* fingerprints(data, offsets, validity, first, hashes, present): hashes[i] = Fingerprint64 of
 * value i and present[i] = 1, or, for a null or empty value, b""'s and 0. */
static PyObject *fingerprints(PyObject *self, PyObject *args) {
  PyObject *data, *offsets, *validity, *hashes_object, *present_object;
  long long first;
  if (!PyArg_ParseTuple(args, "OOOLOO", &data, &offsets, &validity, &first, &hashes_object,
                        &present_object))
    return NULL;
  Values values;
  Py_buffer hashes, present;
  const char *problem = NULL;
  if (get_values(data, offsets, validity, first, &values) < 0) return NULL;
  if (get_buffer(hashes_object, &hashes, 8, 1, "hashes") < 0) goto no_hashes;
  if (get_buffer(present_object, &present, 1, 1, "present") < 0) goto no_present;
  if (hashes.len / 8 != values.count || present.len != values.count) {
    PyErr_SetString(PyExc_ValueError, "hashes and present must hold one item per value");
    goto bad;
  }
  uint64_t *hash = hashes.buf;
  uint8_t *is_present = present.buf;
  Column column = column_of(&values);
  Py_BEGIN_ALLOW_THREADS
  for (Py_ssize_t i = 0; i < column.count; ++i) {
    int found = fingerprint_at(column, i, &hash[i]);
    if (found < 0) {
      problem = OUTSIDE_DATA;
      break;
    }
    if (!found) hash[i] = K2;
    is_present[i] = (uint8_t)found;
  }
  Py_END_ALLOW_THREADS
  if (problem) PyErr_SetString(PyExc_ValueError, problem);
bad:
  PyBuffer_Release(&present);
no_present:
  PyBuffer_Release(&hashes);
no_hashes:
  release_values(&values);
  if (PyErr_Occurred()) return NULL;
  Py_RETURN_NONE;
}

/* splitmix64's finaliser (a bijection spreading every input bit; tfscale.data.value_counts'
 * mix64). */
static inline uint64_t mix64(uint64_t x) {
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

/* How a present value's id follows from its fingerprint. BY_BUCKET: `first_id` + its bucket
 * among `buckets` (modulo 2**63 - 1 first: `to_hash_bucket_fast`'s value with that many
 * buckets); BY_TABLE: the id `table` holds for that value XOR `salt`, `absent` when the table
 * does not hold it; BY_FINGERPRINT: the counting pass's (field, value) fingerprint, mix64 of the
 * fingerprint XOR the field's `mix`, 1 in place of 0 (tfscale.data.value_counts' fingerprints;
 * 0 marks a missing value there). */
enum { BY_BUCKET = 0, BY_TABLE = 1, BY_FINGERPRINT = 2 };

typedef struct {
  int kind;
  uint64_t buckets, mix;
  __uint128_t reciprocal;
  int64_t first_id;
  Probe table;
  int64_t salt, absent;
} Rule;

static inline __attribute__((always_inline)) int64_t id_by(Rule rule, uint64_t hash) {
  if (rule.kind == BY_FINGERPRINT) {
    uint64_t mixed = mix64(hash ^ rule.mix);
    return (int64_t)(mixed + (mixed == 0));
  }
  uint64_t key = within_hash_range(hash);
  if (rule.kind == BY_TABLE) return id_of(rule.table, (int64_t)key ^ rule.salt, rule.absent);
  return rule.first_id + (int64_t)remainder_of(key, rule.reciprocal, rule.buckets);
}

/* at[i * stride] = the id `rule` gives value i of `column`, `missing` for a null or empty one;
 * -1 when an offset lies outside the bytes. Inlined where the rule is built, with everything it
 * reads passed by value: the compiler keeps it in registers across the writes, and drops the
 * branches on the rule's kind and the offsets' width. */
static inline __attribute__((always_inline)) int encode_column(Column column, Rule rule,
                                                               int64_t missing, char *at,
                                                               Py_ssize_t stride) {
  for (Py_ssize_t i = 0; i < column.count; ++i) {
    uint64_t hash;
    int found = fingerprint_at(column, i, &hash);
    if (found < 0) return -1;
    *(int64_t *)(at + i * stride) = found ? id_by(rule, hash) : missing;
  }
  return 0;
}

/* out[i] = the id `rule` gives value i, without the GIL; a ValueError (and -1) when an offset
 * lies outside the bytes, or out's length is not the values'. */
static inline __attribute__((always_inline)) int encode(const Values *values, Rule rule,
                                                        int64_t missing, Output *out) {
  if (out->count != values->count) {
    PyErr_SetString(PyExc_ValueError, "out must hold one item per value");
    return -1;
  }
  Column column = column_of(values);
  int outside;
  Py_BEGIN_ALLOW_THREADS
  if (column.wide) {  /* each branch a copy of the loop for one width, known as a constant */
    column.wide = 1;
    outside = encode_column(column, rule, missing, out->at, out->stride);
  } else {
    column.wide = 0;
    outside = encode_column(column, rule, missing, out->at, out->stride);
  }
  Py_END_ALLOW_THREADS
  if (outside) PyErr_SetString(PyExc_ValueError, OUTSIDE_DATA);
  return outside;
}

/* bucket_ids(data, offsets, validity, first, buckets, first_id, missing, out): out[i] =
 * first_id + (Fingerprint64 of value i modulo 2**63 - 1) modulo buckets, or `missing` for a null
 * or empty value: `to_hash_bucket_fast`'s bucket, shifted. */
static PyObject *bucket_ids(PyObject *self, PyObject *args) {
  PyObject *data, *offsets, *validity, *out_object;
  long long first, first_id, missing;
  unsigned long long buckets;
  if (!PyArg_ParseTuple(args, "OOOLKLLO", &data, &offsets, &validity, &first, &buckets,
                        &first_id, &missing, &out_object))
    return NULL;
  if (buckets == 0) {
    PyErr_SetString(PyExc_ValueError, "buckets must be positive");
    return NULL;
  }
  Rule rule = {.kind = BY_BUCKET, .buckets = buckets, .reciprocal = reciprocal_of(buckets),
               .first_id = first_id};
  Values values;
  Output out;
  if (get_values(data, offsets, validity, first, &values) < 0) return NULL;
  if (get_output(out_object, &out) == 0) {
    encode(&values, rule, missing, &out);
    PyBuffer_Release(&out.view);
  }
  release_values(&values);
  if (PyErr_Occurred()) return NULL;
  Py_RETURN_NONE;
}

/* table_ids(data, offsets, validity, first, salt, slots, tags, absent, missing, out): out[i] =
 * the key table's id of key (Fingerprint64 of value i modulo 2**63 - 1) XOR salt, `absent` when
 * the table does not hold it, `missing` for a null or empty value. */
static PyObject *table_ids(PyObject *self, PyObject *args) {
  PyObject *data, *offsets, *validity, *slots, *tags, *out_object;
  long long first, salt, absent, missing;
  if (!PyArg_ParseTuple(args, "OOOLLOOLLO", &data, &offsets, &validity, &first, &salt, &slots,
                        &tags, &absent, &missing, &out_object))
    return NULL;
  if (salt < 0) {
    PyErr_SetString(PyExc_ValueError, "salt must not be negative");
    return NULL;
  }
  Table table;
  Probe probe;
  Values values;
  Output out;
  if (get_table(slots, tags, &table, &probe, 0) < 0) return NULL;
  Rule rule = {.kind = BY_TABLE, .table = probe, .salt = salt, .absent = absent};
  if (get_values(data, offsets, validity, first, &values) == 0) {
    if (get_output(out_object, &out) == 0) {
      encode(&values, rule, missing, &out);
      PyBuffer_Release(&out.view);
    }
    release_values(&values);
  }
  release_table(&table);
  if (PyErr_Occurred()) return NULL;
  Py_RETURN_NONE;
}

/* take(values, indices, validity, first, missing, out): out[i] = values[indices[i]], or `missing`
 * where the index is null (bit first + i of Arrow bitmap `validity` unset; None: none is). values
 * int64; indices signed integers of 1, 2, 4 or 8 bytes (an Arrow dictionary's), one per item of
 * out, each valid one within values. */
static PyObject *take(PyObject *self, PyObject *args) {
  PyObject *values_object, *indices_object, *validity_object, *out_object;
  long long first, missing;
  if (!PyArg_ParseTuple(args, "OOOLLO", &values_object, &indices_object, &validity_object,
                        &first, &missing, &out_object))
    return NULL;
  Py_buffer values, indices, validity;
  Output out;
  const uint8_t *bits = NULL;
  const char *problem = NULL;
  if (get_buffer(values_object, &values, 8, 0, "values") < 0) return NULL;
  if (get_buffer(indices_object, &indices, 0, 0, "indices") < 0) goto no_indices;
  if (get_output(out_object, &out) < 0) goto no_out;
  Py_ssize_t size = indices.itemsize, limit = values.len / 8;
  if (size != 1 && size != 2 && size != 4 && size != 8) {
    PyErr_SetString(PyExc_TypeError, "indices must be integers of 1, 2, 4 or 8 bytes");
    goto bad;
  }
  if (indices.len / size != out.count) {
    PyErr_SetString(PyExc_ValueError, "indices and out must be of one length");
    goto bad;
  }
  if (get_validity(validity_object, &validity, first, out.count, &bits) < 0) goto bad;
  const int64_t *value = values.buf;
  Py_BEGIN_ALLOW_THREADS
  for (Py_ssize_t i = 0; i < out.count; ++i) {
    if (!is_valid(bits, first + i)) {
      put(&out, i, missing);
      continue;
    }
    int64_t at = size == 4   ? ((const int32_t *)indices.buf)[i]
                 : size == 1 ? ((const int8_t *)indices.buf)[i]
                 : size == 2 ? ((const int16_t *)indices.buf)[i]
                             : ((const int64_t *)indices.buf)[i];
    if (at < 0 || at >= limit) {
      problem = "an index lies outside values";
      break;
    }
    put(&out, i, value[at]);
  }
  Py_END_ALLOW_THREADS
  if (bits) PyBuffer_Release(&validity);
  if (problem) PyErr_SetString(PyExc_ValueError, problem);
bad:
  PyBuffer_Release(&out.view);
no_out:
  PyBuffer_Release(&indices);
no_indices:
  PyBuffer_Release(&values);
  if (PyErr_Occurred()) return NULL;
  Py_RETURN_NONE;
}

/* ------------------------------------------------------------------- lines of delimited text */

/* What a line's column holds (parse_lines' `roles`). */
enum { SKIPPED = 0, LABEL = 1, INTEGER = 2, CATEGORICAL = 3, DERIVED_FROM = 4 };

/* The integer field [s, e) (not empty) when it matches the reader's pattern ([+-]?[0-9]+, any
 * leading zeros) within int64's range, into *value; 0 when it does not. */
static inline int parse_int64(const uint8_t *s, const uint8_t *e, int64_t *value) {
  int negative = 0;
  if (*s == '+' || *s == '-') negative = *s++ == '-';
  if (s == e) return 0;
  while (s < e - 1 && *s == '0') ++s;  /* leading zeros, the last digit kept */
  if (e - s > 19) return 0;            /* more than int64's 19 digits */
  uint64_t magnitude = 0;              /* 19 digits fit in 64 bits */
  for (; s < e; ++s) {
    unsigned digit = (unsigned)(*s - '0');
    if (digit > 9) return 0;
    magnitude = magnitude * 10 + digit;
  }
  if (magnitude > (uint64_t)INT64_MAX + (uint64_t)negative) return 0;
  *value = negative ? (int64_t)(0 - magnitude) : (int64_t)magnitude;
  return 1;
}

/* A block of lines read field by field: the next byte, the block's end, the delimiter. */
typedef struct {
  const uint8_t *p, *end;
  uint8_t delimiter;
} Cursor;

/* The cursor past the line it is at, which is left unread. */
static inline void skip_line(Cursor *at) {
  const uint8_t *line_end = memchr(at->p, '\n', (size_t)(at->end - at->p));
  at->p = line_end ? line_end + 1 : at->end;
}

/* Whether a line starts at the cursor (it is not empty, nor past the block's end). */
static inline int line_starts(const Cursor *at) { return at->p < at->end && *at->p != '\n'; }

/* The next field of a line into [*start, *stop), the cursor moved past its delimiter or the
 * line's end; 0 when the line is not clean there: a field too few (`last` unset and the line
 * ends) or too many (`last` set and a delimiter follows). */
static inline __attribute__((always_inline)) const uint8_t *field_end(const uint8_t *p,
                                                                      const uint8_t *end,
                                                                      uint8_t delimiter) {
  while (p < end && *p != delimiter && *p != '\n') ++p;
  return p;
}

static inline __attribute__((always_inline)) int next_field(Cursor *at, int last,
                                                            const uint8_t **start,
                                                            const uint8_t **stop) {
  const uint8_t *p = at->p, *end = at->end;
  uint8_t delimiter = at->delimiter;
  *start = p;
  p = field_end(p, end, delimiter);
  *stop = p;
  if (last ? p < end && *p != '\n' : p == end || *p != delimiter) return 0;
  at->p = p < end ? p + 1 : end;
  return 1;
}

/* Whether [s, e) is a label: "0" or "1". */
static inline int is_label(const uint8_t *s, const uint8_t *e) {
  return e - s == 1 && (*s == '0' || *s == '1');
}

/* A line's layout as parse_lines takes it: column j holds what roles[j] says, the field
 * places[j] of its kind; keep[i] whether line i is read. */
typedef struct {
  const uint8_t *roles, *keep;
  const int32_t *places;
  Py_ssize_t columns, lines;
} Layout;

/* Where parse_lines writes a block's rows, as plain pointers (see Column). */
typedef struct {
  float *labels, *dense;
  uint8_t *present;
  int64_t *ids, *spans, *starts;
  Py_ssize_t dense_fields, categorical_fields, derived_from;
} Rows;

/* The kept lines of the block at `at` into `rows`: -1 - the first kept line that is not clean
 * (a field too few or too many, an empty line, a label other than "0" or "1", an integer off
 * the pattern or out of range), else the rows written. Lines not kept are passed over unread. */
static inline __attribute__((always_inline)) Py_ssize_t parse_rows(Cursor at, Layout layout,
                                                                   const Rule *rules, int kind,
                                                                   int64_t missing, Rows rows) {
  const uint8_t *block = at.p;
  Py_ssize_t row = 0;
  for (Py_ssize_t line = 0; line < layout.lines; ++line) {
    if (!layout.keep[line]) {
      skip_line(&at);
      continue;
    }
    if (!line_starts(&at)) return -1 - line;
    rows.starts[row] = at.p - block;
    float *dense = rows.dense + row * rows.dense_fields;
    uint8_t *present = rows.present + row * rows.dense_fields;
    int64_t *ids = rows.ids + row * rows.categorical_fields;
    int64_t *spans = rows.spans + 2 * row * rows.derived_from;
    for (Py_ssize_t column = 0; column < layout.columns; ++column) {
      const uint8_t *s, *e;
      if (!next_field(&at, column == layout.columns - 1, &s, &e)) return -1 - line;
      int32_t place = layout.places[column];
      switch (layout.roles[column]) {
        case LABEL:
          if (!is_label(s, e)) return -1 - line;
          rows.labels[row] = (float)(*s - '0');
          break;
        case INTEGER: {
          int64_t value = 0;
          if (e > s && !parse_int64(s, e, &value)) return -1 - line;
          dense[place] = (float)value;
          present[place] = e > s;
          break;
        }
        case CATEGORICAL: {
          Rule rule = rules[place];
          rule.kind = kind;  /* a constant where parse_lines inlines this */
          ids[place] = e > s ? id_by(rule, fingerprint64(s, (uint64_t)(e - s))) : missing;
          break;
        }
        case DERIVED_FROM:
          spans[2 * place] = s - block;
          spans[2 * place + 1] = e - s;
          break;
      }
    }
    ++row;
  }
  return row;
}

/* parse_lines(block, delimiter, roles, places, keep, kind, per_field, slots, tags, absent,
 * missing, labels, dense, present, ids, spans, starts): the lines of `block` (bytes of whole
 * lines, "\n" ending each but perhaps the last; one byte of `keep` per line) whose keep byte is
 * set, parsed, checked and encoded into C-ordered rows: labels float32 [m], dense float32 [m, D]
 * and present uint8 [m, D] of the integer fields, ids int64 [m, C] of the categorical ones,
 * spans int64 [m, E, 2] of the columns derived fields are computed from (each value's start in
 * the block and its length), and starts int64 [m], where each row's line starts in the block.
 * Column j of a line holds what roles[j] says (0 skipped, 1 the label, 2 integer field
 * places[j], 3 categorical field places[j], 4 the column places[j] of those derived fields come
 * from); a categorical value's id follows Rule's `kind` with `per_field` [C] the buckets
 * (uint64, ids from 1), the salts (int64, with the key table `slots`, `tags` and `absent`) or
 * the mixes (uint64) of the fields. An empty integer field is missing (present 0), an empty
 * categorical value `missing`. Returns m, or -1 - the first kept line that is not clean (nothing
 * is then to be read from the outputs). */
static PyObject *parse_lines(PyObject *self, PyObject *args) {
  PyObject *block_object, *roles_object, *places_object, *keep_object, *per_field_object,
      *slots_object, *tags_object, *labels_object, *dense_object, *present_object, *ids_object,
      *spans_object, *starts_object;
  int delimiter, kind;
  long long absent, missing;
  if (!PyArg_ParseTuple(args, "OiOOOiOOOLLOOOOOO", &block_object, &delimiter, &roles_object,
                        &places_object, &keep_object, &kind, &per_field_object, &slots_object,
                        &tags_object, &absent, &missing, &labels_object, &dense_object,
                        &present_object, &ids_object, &spans_object, &starts_object))
    return NULL;
  if (delimiter < 1 || delimiter > 255 || delimiter == '\n' || kind < BY_BUCKET ||
      kind > BY_FINGERPRINT) {
    PyErr_SetString(PyExc_ValueError,
                    "parse_lines takes a one-byte delimiter other than a line end, and a kind "
                    "of 0 (buckets), 1 (key table) or 2 (fingerprints)");
    return NULL;
  }
  Py_buffer views[11];
  int held = 0, by_table = kind == BY_TABLE;
  Table table;
  Rule *rules = NULL;
  Py_ssize_t result = 0;
  PyObject *objects[] = {block_object, roles_object, places_object, keep_object,
                         per_field_object, labels_object, dense_object, present_object,
                         ids_object, spans_object, starts_object};
  const Py_ssize_t itemsizes[] = {0, 1, 4, 1, 8, 4, 4, 1, 8, 8, 8};
  for (; held < 11; ++held)
    if (get_buffer(objects[held], &views[held], itemsizes[held], held >= 5, "an array") < 0)
      goto done;
  Probe probe = {0};
  if (by_table && get_table(slots_object, tags_object, &table, &probe, 0) < 0) goto done;
  Py_ssize_t columns = views[1].len, lines = views[3].len, fields = views[4].len / 8;
  Py_ssize_t rows_out = views[5].len / 4;
  Py_ssize_t dense_fields = rows_out ? views[6].len / 4 / rows_out : 0;
  Py_ssize_t derived_from = rows_out ? views[9].len / 16 / rows_out : 0;
  const uint8_t *roles = views[1].buf;
  const int32_t *places = views[2].buf;
  int bad = views[2].len != columns * 4 || views[7].len != views[6].len / 4 ||
            views[6].len != rows_out * dense_fields * 4 || views[8].len != rows_out * fields * 8 ||
            views[9].len != rows_out * derived_from * 16 || views[10].len != rows_out * 8;
  for (Py_ssize_t j = 0; j < columns && !bad; ++j)
    bad = roles[j] > DERIVED_FROM || places[j] < 0 ||
          (roles[j] == INTEGER && rows_out && places[j] >= dense_fields) ||
          (roles[j] == DERIVED_FROM && rows_out && places[j] >= derived_from) ||
          (roles[j] == CATEGORICAL && places[j] >= fields);
  if (bad) {
    PyErr_SetString(PyExc_ValueError,
                    "parse_lines' roles, places and outputs do not agree in their sizes");
    goto done_table;
  }
  rules = PyMem_Malloc((size_t)(fields ? fields : 1) * sizeof *rules);
  if (!rules) {
    PyErr_NoMemory();
    goto done_table;
  }
  for (Py_ssize_t k = 0; k < fields; ++k) {
    Rule rule = {.kind = kind, .table = probe, .absent = absent, .first_id = 1};
    uint64_t value = ((const uint64_t *)views[4].buf)[k];
    if (kind == BY_TABLE) {
      rule.salt = (int64_t)value;
    } else if (kind == BY_FINGERPRINT) {
      rule.mix = value;
    } else {
      rule.buckets = value;
      if (rule.buckets == 0) {
        PyErr_SetString(PyExc_ValueError, "buckets must be positive");
        goto done_table;
      }
      rule.reciprocal = reciprocal_of(rule.buckets);
    }
    rules[k] = rule;
  }
  Rows rows = {.labels = views[5].buf, .dense = views[6].buf, .present = views[7].buf,
               .ids = views[8].buf, .spans = views[9].buf, .starts = views[10].buf,
               .dense_fields = dense_fields, .categorical_fields = fields,
               .derived_from = derived_from};
  const uint8_t *start = views[0].buf, *keep = views[3].buf;
  Py_ssize_t kept = 0;
  for (Py_ssize_t line = 0; line < lines; ++line) kept += keep[line] != 0;
  if (kept != rows_out) {
    PyErr_SetString(PyExc_ValueError, "parse_lines' outputs must hold one row per kept line");
    goto done_table;
  }
  Cursor at = {.p = start, .end = start + views[0].len, .delimiter = (uint8_t)delimiter};
  Layout layout = {.roles = roles, .keep = keep, .places = places, .columns = columns,
                   .lines = lines};
  Py_BEGIN_ALLOW_THREADS
  if (kind == BY_TABLE)  /* each branch a copy of the loop for one kind, known as a constant */
    result = parse_rows(at, layout, rules, BY_TABLE, missing, rows);
  else if (kind == BY_BUCKET)
    result = parse_rows(at, layout, rules, BY_BUCKET, missing, rows);
  else
    result = parse_rows(at, layout, rules, BY_FINGERPRINT, missing, rows);
  Py_END_ALLOW_THREADS
done_table:
  if (by_table) release_table(&table);
done:
  PyMem_Free(rules);
  while (held-- > 0) PyBuffer_Release(&views[held]);
  if (PyErr_Occurred()) return NULL;
  return PyLong_FromSsize_t(result);
}

/* ------------------------------------------------------------------- a pass's counting */

/* The counting pass's state as count_keys takes it (tfscale.data.value_counts owns the arrays):
 * a key table of (field, value) fingerprints, the top bit cleared, to entries; each entry's count
 * and field; where in the keys the entries made since `first` came from; the count-min sketch
 * (NULL before a spill: every new key is then an entry); the KMV candidates found. */
#define SKETCH_DEPTH 4
typedef struct {
  Probe table;
  int64_t *counts, *origins;
  int16_t *field_of;
  int64_t entries, limit, first, origin_room;
  void *sketch;
  int wide_counters;
  int64_t width, gate, sketched;
  const uint64_t *limits;
  uint64_t *candidates;
  int64_t written, room;
} Counting;

/* The key table's key of a fingerprint: its 63 low bits (keys are never negative). */
static inline int64_t table_key(uint64_t fingerprint) {
  return (int64_t)(fingerprint & 0x7fffffffffffffffULL);
}

/* Where `key`'s counter of sketch row `row` lies in the sketch (value_counts' _slots). */
static inline int64_t counter_at(const Counting *c, uint64_t key, int row) {
  return row * c->width + (int64_t)(mix64(key + (uint64_t)row + 1) & (uint64_t)(c->width - 1));
}

/* Adds `clipped` to each of `key`'s counters, saturating at the gate; returns the sketch's
 * estimate of `key` before the add (the least of its counters, which stay at most the gate). */
static inline int64_t sketch_add(Counting *c, uint64_t key, int64_t clipped) {
  int64_t least = INT64_MAX;
  for (int row = 0; row < SKETCH_DEPTH; ++row) {
    int64_t at = counter_at(c, key, row);
    int64_t counter = c->wide_counters ? ((uint32_t *)c->sketch)[at]
                                       : ((uint16_t *)c->sketch)[at];
    if (counter < least) least = counter;
    int64_t added = counter + clipped < c->gate ? counter + clipped : c->gate;
    if (c->wide_counters)
      ((uint32_t *)c->sketch)[at] = (uint32_t)added;
    else
      ((uint16_t *)c->sketch)[at] = (uint16_t)added;
  }
  return least;
}

/* A new entry for `key` (its slot's negative code `slot`) with `count`, from position i. */
static inline void enter(Counting *c, int64_t slot, int64_t key, int64_t count, int16_t field,
                         Py_ssize_t i) {
  slot = -1 - slot;
  c->table.tags[slot] = (uint8_t)tag_of(key);
  c->table.slots[2 * slot] = key;
  c->table.slots[2 * slot + 1] = c->entries;
  c->counts[c->entries] = count;
  c->field_of[c->entries] = field;
  c->origins[c->entries - c->first] = i;
  ++c->entries;
}

/* The cache lines a search for `fingerprint` reads first: its home group's tags and first
 * slots (a group fills from its start). */
static inline void prefetch_home(const Counting *c, uint64_t fingerprint) {
  int64_t group = table_key(fingerprint) & c->table.mask & ~(int64_t)(GROUP - 1);
  __builtin_prefetch(c->table.tags + group);
  __builtin_prefetch(c->table.slots + 2 * group);
}

/* The slot of `fingerprint` (slot_of's), and what counting it writes fetched ahead (its home
 * group fetched before): its entry's count when the table holds it, else its sketch counters,
 * a miss in each row otherwise. */
static inline int64_t look_ahead(const Counting *c, uint64_t fingerprint) {
  int64_t slot = slot_of(c->table, table_key(fingerprint));
  if (slot >= 0) {
    __builtin_prefetch(c->counts + c->table.slots[2 * slot + 1], 1);
    return slot;
  }
  if (!c->sketch) return slot;
  for (int row = 0; row < SKETCH_DEPTH; ++row) {
    int64_t at = counter_at(c, fingerprint, row);
    __builtin_prefetch(c->wide_counters ? (void *)((uint32_t *)c->sketch + at)
                                        : (void *)((uint16_t *)c->sketch + at), 1);
  }
  return slot;
}

#define HOME_AHEAD 32     /* keys ahead whose home group is fetched */
#define COUNTERS_AHEAD 16 /* keys ahead looked up, what counting them writes fetched */
#define LOOKED_UP 32      /* a power of two above COUNTERS_AHEAD: the slots found ahead */

/* A slot found ahead: key `at`'s, found when the table held `entries` entries (a key found
 * stays where it is; one not found is still not there while no entry was made since). */
typedef struct {
  Py_ssize_t at;
  int64_t slot, entries;
} LookedUp;

/* Counts keys[start:] (weights NULL: 1 each; fields NULL: key i of field i mod num_fields);
 * returns where it stopped: the keys' end, or the first key that might need an entry past the
 * limit or a candidate past the room. */
static Py_ssize_t count_from(Counting *c, const uint64_t *keys, const int64_t *weights,
                             const int16_t *fields, Py_ssize_t num_fields, Py_ssize_t start,
                             Py_ssize_t count) {
  Py_ssize_t field = num_fields ? start % num_fields : 0;
  LookedUp ahead[LOOKED_UP];
  for (int k = 0; k < LOOKED_UP; ++k) ahead[k].at = -1;
  for (Py_ssize_t i = start; i < count; ++i, field = field + 1 == num_fields ? 0 : field + 1) {
    if (i + HOME_AHEAD < count && keys[i + HOME_AHEAD]) prefetch_home(c, keys[i + HOME_AHEAD]);
    Py_ssize_t next = i + COUNTERS_AHEAD;
    if (next < count && keys[next]) {
      LookedUp *found = &ahead[next & (LOOKED_UP - 1)];
      found->at = next;
      found->slot = look_ahead(c, keys[next]);
      found->entries = c->entries;
    }
    uint64_t fingerprint = keys[i];
    if (!fingerprint) continue;
    if (c->entries == c->limit || c->entries - c->first == c->origin_room ||
        c->written == c->room)
      return i;
    int64_t key = table_key(fingerprint);
    int64_t weight = weights ? weights[i] : 1;
    int16_t f = fields ? fields[i] : (int16_t)field;
    const LookedUp *found = &ahead[i & (LOOKED_UP - 1)];
    int64_t slot = found->at == i && (found->slot >= 0 || found->entries == c->entries)
                       ? found->slot
                       : slot_of(c->table, key);
    if (slot >= 0) {
      c->counts[c->table.slots[2 * slot + 1]] += weight;
      continue;
    }
    if (!c->sketch) {
      enter(c, slot, key, weight, f, i);
      continue;
    }
    c->sketched += weight;
    int64_t before = sketch_add(c, fingerprint, weight < c->gate ? weight : c->gate);
    if (fingerprint <= c->limits[f]) {
      c->candidates[2 * c->written] = (uint64_t)f;
      c->candidates[2 * c->written + 1] = fingerprint;
      ++c->written;
    }
    if (before + weight >= c->gate) enter(c, slot, key, before + weight, f, i);
  }
  return count;
}

/* count_keys(keys, weights, fields, start, slots, tags, counts, field_of, origins, limit, sketch,
 * gate, limits, candidates, state): counts uint64 `keys` (0: none, a missing value) from
 * `start` on, each `weights`[i] times (int64, or None: once), key i of field `fields`[i]
 * (int16, or None: i mod len(limits)). A key the table holds adds to its entry's count; another
 * becomes entry e = `state`[0] (its count and field into counts[e] and field_of[e], its position
 * i into origins[e - the entries at the call's start]),
 * before a spill (`sketch` None) at once, after one (`sketch` uint16 or uint32 [4, width]) when
 * the sketch's estimate before it plus its weight reaches `gate`, after its weight, at most the
 * gate, is added to its counters (saturating at the gate). A sketched key at or under its
 * field's `limits` (uint64) is written to `candidates` (uint64 [room, 2] of (field, key)) at
 * state[1]; state[2] adds up the weights sketched. Returns len(keys), or the position of a key
 * that might need an entry at `limit` or past the room of origins, or a candidate past the
 * room of candidates (count on from it once the caller has made room). */
static PyObject *count_keys(PyObject *self, PyObject *args) {
  PyObject *keys_object, *weights_object, *fields_object, *slots_object, *tags_object,
      *counts_object, *field_of_object, *origins_object, *sketch_object, *limits_object,
      *candidates_object, *state_object;
  Py_ssize_t start;
  long long limit, gate;
  if (!PyArg_ParseTuple(args, "OOOnOOOOOLOLOOO", &keys_object, &weights_object, &fields_object,
                        &start, &slots_object, &tags_object, &counts_object, &field_of_object,
                        &origins_object, &limit, &sketch_object, &gate, &limits_object,
                        &candidates_object, &state_object))
    return NULL;
  Py_buffer views[9];
  PyObject *objects[] = {keys_object, weights_object, fields_object, counts_object,
                         field_of_object, origins_object, sketch_object, limits_object,
                         candidates_object};
  const Py_ssize_t itemsizes[] = {8, 8, 2, 8, 2, 8, 0, 8, 8};
  int held[9] = {0}, state_held = 0, table_held = 0;
  Py_buffer state_view;
  Table table;
  Counting c = {0};
  Py_ssize_t reached = -1;
  for (int k = 0; k < 9; ++k) {
    if (objects[k] == Py_None && (k == 1 || k == 2 || k == 6)) continue;
    if (get_buffer(objects[k], &views[k], itemsizes[k], k >= 3 && k != 7, "an array") < 0)
      goto done;
    held[k] = 1;
  }
  if (get_buffer(state_object, &state_view, 8, 1, "state") < 0) goto done;
  state_held = 1;
  if (get_table(slots_object, tags_object, &table, &c.table, 1) < 0) goto done;
  table_held = 1;
  Py_ssize_t count = views[0].len / 8, num_fields = views[7].len / 8;
  Py_ssize_t capacity = views[3].len / 8;
  int64_t *state = state_view.buf;
  c.counts = views[3].buf;
  c.field_of = views[4].buf;
  c.origins = views[5].buf;
  c.limits = views[7].buf;
  c.candidates = views[8].buf;
  c.room = views[8].len / 16;
  c.gate = gate;
  if (held[6]) {
    c.sketch = views[6].buf;
    c.wide_counters = views[6].itemsize == 4;
    c.width = views[6].len / views[6].itemsize / SKETCH_DEPTH;
  }
  if (state_view.len != 24 || num_fields < 1 || views[4].len != capacity * 2 ||
      views[5].len < 8 || c.room < 1 || (held[1] && views[1].len != count * 8) ||
      (held[2] && views[2].len != count * 2) || start < 0 || start > count || gate < 1 ||
      limit > capacity || state[0] < 0 || state[0] > limit || state[1] < 0 ||
      state[1] > c.room || 2 * limit > c.table.mask + 1 ||
      (held[6] && ((views[6].itemsize != 2 && views[6].itemsize != 4) || c.width < 1 ||
                   (c.width & (c.width - 1)) ||
                   views[6].len != c.width * SKETCH_DEPTH * views[6].itemsize ||
                   gate > (views[6].itemsize == 2 ? 0xffff : 0xffffffffLL)))) {
    PyErr_SetString(PyExc_ValueError,
                    "count_keys' arrays do not agree in their sizes (the table must stay at "
                    "most half full)");
    goto done;
  }
  if (held[2]) {
    const int16_t *fields = views[2].buf;
    for (Py_ssize_t i = 0; i < count; ++i)
      if (fields[i] < 0 || fields[i] >= num_fields) {
        PyErr_SetString(PyExc_ValueError, "a field lies outside limits");
        goto done;
      }
  }
  c.entries = c.first = state[0];
  c.origin_room = views[5].len / 8;
  c.limit = limit;
  c.written = state[1];
  c.sketched = state[2];
  Py_BEGIN_ALLOW_THREADS
  reached = count_from(&c, views[0].buf, held[1] ? views[1].buf : NULL,
                       held[2] ? views[2].buf : NULL, held[2] ? 0 : num_fields, start, count);
  Py_END_ALLOW_THREADS
  state[0] = c.entries;
  state[1] = c.written;
  state[2] = c.sketched;
done:
  if (table_held) release_table(&table);
  if (state_held) PyBuffer_Release(&state_view);
  for (int k = 8; k >= 0; --k)
    if (held[k]) PyBuffer_Release(&views[k]);
  if (PyErr_Occurred()) return NULL;
  return PyLong_FromSsize_t(reached);
}

/* value_spans(block, starts, delimiter, columns, origins, num_fields, spans): spans[j] = (start,
 * length) in `block` of the value at position origins[j] of a parse_lines ids array [m,
 * num_fields]: field origins[j] mod num_fields (the line's column `columns`[field], int32) of
 * the line starting at starts[origins[j] / num_fields]. */
static PyObject *value_spans(PyObject *self, PyObject *args) {
  PyObject *block_object, *starts_object, *columns_object, *origins_object, *spans_object;
  int delimiter;
  Py_ssize_t num_fields;
  if (!PyArg_ParseTuple(args, "OOiOOnO", &block_object, &starts_object, &delimiter,
                        &columns_object, &origins_object, &num_fields, &spans_object))
    return NULL;
  Py_buffer views[5];
  PyObject *objects[] = {block_object, starts_object, columns_object, origins_object,
                         spans_object};
  const Py_ssize_t itemsizes[] = {0, 8, 4, 8, 8};
  int held = 0;
  const char *problem = NULL;
  for (; held < 5; ++held)
    if (get_buffer(objects[held], &views[held], itemsizes[held], held == 4, "an array") < 0)
      goto done;
  Py_ssize_t count = views[3].len / 8, rows = views[1].len / 8;
  if (num_fields < 1 || views[2].len != num_fields * 4 || views[4].len != count * 16) {
    PyErr_SetString(PyExc_ValueError, "value_spans' arrays do not agree in their sizes");
    goto done;
  }
  const uint8_t *block = views[0].buf, *end = block + views[0].len;
  const int64_t *starts = views[1].buf, *origins = views[3].buf;
  const int32_t *columns = views[2].buf;
  int64_t *spans = views[4].buf;
  Py_BEGIN_ALLOW_THREADS
  for (Py_ssize_t j = 0; j < count && !problem; ++j) {
    int64_t row = origins[j] / num_fields;
    if (origins[j] < 0 || row >= rows || starts[row] < 0 || starts[row] > views[0].len ||
        columns[origins[j] % num_fields] < 0) {
      problem = "an origin or a line start lies outside the block";
      break;
    }
    int64_t column = columns[origins[j] % num_fields];
    const uint8_t *p = block + starts[row];
    for (int64_t k = 0; k < column && !problem; ++k) {
      p = field_end(p, end, (uint8_t)delimiter);
      if (p == end || *p == '\n')
        problem = "a line holds fewer columns than asked for";
      ++p;
    }
    const uint8_t *q = field_end(p, end, (uint8_t)delimiter);
    spans[2 * j] = p - block;
    spans[2 * j + 1] = q - p;
  }
  Py_END_ALLOW_THREADS
  if (problem) PyErr_SetString(PyExc_ValueError, problem);
done:
  while (held-- > 0) PyBuffer_Release(&views[held]);
  if (PyErr_Occurred()) return NULL;
  Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"fingerprints", fingerprints, METH_VARARGS,
     "fingerprints(data, offsets, validity, first, hashes, present): FarmHash Fingerprint64s."},
    {"bucket_ids", bucket_ids, METH_VARARGS,
     "bucket_ids(data, offsets, validity, first, buckets, first_id, missing, out): hashed ids."},
    {"table_ids", table_ids, METH_VARARGS,
     "table_ids(data, offsets, validity, first, salt, slots, tags, absent, missing, out): the "
     "key table's ids of the values."},
    {"take", take, METH_VARARGS,
     "take(values, indices, validity, first, missing, out): values at indices, missing at nulls."},
    {"insert", insert, METH_VARARGS,
     "insert(slots, tags, keys, ids): keys and their ids into a key table."},
    {"lookup", lookup, METH_VARARGS,
     "lookup(slots, tags, keys, absent, out): the ids of keys."},
    {"parse_lines", parse_lines, METH_VARARGS,
     "parse_lines(block, delimiter, roles, places, keep, kind, per_field, slots, tags, absent, "
     "missing, labels, dense, present, ids, spans, starts): lines parsed, checked and encoded "
     "into rows."},
    {"count_keys", count_keys, METH_VARARGS,
     "count_keys(keys, weights, fields, start, slots, tags, counts, field_of, origins, limit, "
     "sketch, gate, limits, candidates, state): (field, value) fingerprints counted."},
    {"value_spans", value_spans, METH_VARARGS,
     "value_spans(block, starts, delimiter, columns, origins, num_fields, spans): where values "
     "lie in a block of lines."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "_kernels",
    .m_doc = "The readers' C kernels (tfscale/data/_kernels.c).",
    .m_size = -1,
    .m_methods = methods,
};

PyMODINIT_FUNC PyInit__kernels(void) { return PyModule_Create(&module); }
