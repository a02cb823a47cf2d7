/*
 * The layout of what lives in shared memory, as this build lays it: the
 * size, offset and alignment of every field of every shared structure,
 * known at compile time and folded into one number. A zone or a child
 * table kept across a restart onto a build whose number differs is laid
 * anew instead of read with the wrong layout.
 */
#ifndef AT_LAYOUT_H
#define AT_LAYOUT_H

#include <apr.h>
#include <stddef.h>

typedef struct {
    const char *name;
    apr_size_t offset, size, align;
} at_field_t;

typedef struct {
    const char *name;
    apr_size_t size, align;
    const at_field_t *fields;
    apr_size_t nfields;
} at_record_t;

#define AT_FIELD(type, f)                                                        \
    {#f, offsetof(type, f), sizeof(((type *)0)->f), __alignof__(((type *)0)->f)}
#define AT_RECORD(type, fields)                                                  \
    {#type, sizeof(type), __alignof__(type), fields, sizeof(fields) / sizeof(fields[0])}

/* Folds the records into the number (FNV-1a over every figure and name). */
apr_uint64_t at_layout_fold(apr_uint64_t h, const at_record_t *r, apr_size_t n);

/* The structures the core's shared state embeds (limit=auto, mem=, CoDel,
 * histograms, the client table, a zone's definition, an owner). */
const at_record_t *at_layout_common(apr_size_t *n);

/* The structures only the zone and the child table know. */
const at_record_t *at_zone_layout_records(apr_size_t *n);
const at_record_t *at_life_layout_records(apr_size_t *n);

/* NULL if the record's fields cover its structure with nothing unlisted
 * between them (only the padding their alignment asks for); else what is
 * wrong, in a static buffer. For the tests that keep the lists whole. */
const char *at_layout_gap(const at_record_t *r);

#endif
