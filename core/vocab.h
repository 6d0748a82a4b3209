/*
 * vocab.h - a checkpoint's vocabulary behind one tokenizer interface:
 * text to token ids (with the byte offset where each token begins) and ids
 * back to text.
 *
 * A vocabulary kind (config "tokenizer") is one struct of functions in a
 * file of its own, listed in vocab.c's table:
 *   chars  (tok_chars.c)  one UTF-8 character per token (the default)
 *   words  (tok_words.c)  whitespace-split words, <eos> at each line's end,
 *                         <unk> for a word the vocabulary lacks
 *                         (kimiyoung/transformer-xl's Vocab)
 *   sentencepiece (tok_spm.c) the SentencePiece library's pieces (spm.h), each
 *                         line encoded alone, newlines dropped (seed 004's
 *                         TensorFlow PAR Transformer-XL)
 * Nothing outside core/vocab*.c and core/tok_*.c knows which kind it has.
 */
#ifndef SPANSERVE_VOCAB_H
#define SPANSERVE_VOCAB_H

#include <stddef.h>
#include <stdint.h>

struct tokenizer;

typedef struct vocab {
    const struct tokenizer *kind;
    int n;
    char **tok;            /* id -> the token's own text, NUL-terminated (a character; a word, "\n" for <eos>) */
    char *pool;            /* the strings tok points into */
    size_t max_piece;      /* the longest text one token adds to a stream (vocab_piece) */
    /* chars */
    uint32_t *cp;          /* token id -> code point */
    int32_t *sorted;       /* token ids sorted by code point, for lookup */
    int32_t ascii[128];    /* code point -> id for ASCII, -1 if absent */
    /* words */
    int32_t *table;        /* open addressing: word -> id, -1 empty */
    size_t table_mask;
    int32_t eos, unk;      /* ids of <eos> and <unk> (-1: none) */
    /* sentencepiece: the library's processor (spm.h) */
    struct spm *spm;
    void (*release)(struct vocab *v);   /* frees what a kind holds beside the arrays above (NULL: nothing) */
} vocab_t;

/* One vocabulary kind. */
typedef struct tokenizer {
    const char *name;
    int per_character;     /* a token is one character: nats per token are per character (bpc means something) */
    /* Fills V from the JSON text of __metadata__.vocab (V zeroed): an
     * array of tokens (chars, words) or the kind's own object
     * (sentencepiece). On error vocab_free frees what V holds. */
    int (*parse)(vocab_t *v, const char *json_text, char *err);
    /* LEN bytes of TEXT -> at most CAP ids into IDS, with the byte offset of
     * each token's start into OFFS (a token that stands for no text of its
     * own, as <eos> at the end of a text without a final newline, has the
     * offset LEN). OPEN: the text goes on (a prompt): its last line is not
     * ended. Returns the count, or -1 with ERR. */
    long (*encode)(const vocab_t *v, const char *text, size_t len, int open, int32_t *ids, size_t *offs, size_t cap,
                   char *err);
    /* Tokens at most a text of LEN bytes can become (for the buffers). */
    size_t (*max_tokens)(size_t len);
    /* The text token ID adds to a stream whose previous token is PREV (-1 at
     * the start): into BUF (v->max_piece + 1 bytes), NUL-terminated; its length. */
    size_t (*piece)(const vocab_t *v, int32_t prev, int32_t id, char *buf);
} tokenizer;

/* The kinds, and the one called NAME (NULL when there is none). */
extern const tokenizer *const vocab_kinds[];
const tokenizer *vocab_kind(const char *name);

/* Builds a vocabulary of kind KIND (NULL: chars) from the JSON array text of
 * __metadata__.vocab. */
int vocab_parse_kind(vocab_t *v, const tokenizer *kind, const char *json_text, char *err);
/* The same for characters. */
int vocab_parse(vocab_t *v, const char *json_text, char *err);
void vocab_free(vocab_t *v);
/* chars: the id of code point CP, or -1. */
int32_t vocab_id(const vocab_t *v, uint32_t cp);
/* A whole text (LEN bytes of UTF-8: a file, a text to score) -> token ids.
 * *OUT is malloc'd (caller frees); so is *OFFS (the byte offset of each
 * token) where OFFS is not NULL. Invalid UTF-8, or a character outside a
 * character vocabulary, is an error naming the byte offset. */
int vocab_encode(const vocab_t *v, const char *text, size_t len, int32_t **out, size_t *n, char *err);
/* The same for a text that goes on (a prompt: words do not end its last
 * line with <eos>) when OPEN. */
int vocab_encode_offsets(const vocab_t *v, const char *text, size_t len, int open, int32_t **out, size_t **offs,
                         size_t *n, char *err);
static inline int vocab_encode_prompt(const vocab_t *v, const char *text, size_t len, int32_t **out, size_t *n, char *err)
{
    return vocab_encode_offsets(v, text, len, 1, out, NULL, n, err);
}
/* The text of token ID after token PREV (-1: at the start) into BUF
 * (vocab_max_piece + 1 bytes); its length. */
size_t vocab_piece(const vocab_t *v, int32_t prev, int32_t id, char *buf);
static inline size_t vocab_max_piece(const vocab_t *v) { return v->max_piece; }
/* The text of IDS (a stream from its start) into BUF (capacity CAP,
 * NUL-terminated); the bytes written, or -1 if it does not fit or an id is
 * invalid. */
int vocab_decode(const vocab_t *v, const int32_t *ids, size_t n, char *buf, size_t cap);
/* Decodes one UTF-8 code point at S (LEN bytes left); returns its length in
 * bytes, or 0 if the bytes are not valid UTF-8. */
int utf8_decode(const unsigned char *s, size_t len, uint32_t *cp);

#endif
