/*
 * route_chat.c - the OpenAI-compatible /v1/chat/completions, and the chat
 * templates that write a conversation as a prompt for a model.
 *
 * The models are base character models: they continue text and were never
 * taught a chat format. A conversation is written as what they did learn, the
 * transcript of a play (tiny Shakespeare: a speaker's name and a colon on a
 * line, the speech, a blank line before the next speaker):
 *
 *     SYSTEM:\n{system content}\n\n
 *     USER:\n{user content}\n\n
 *     ASSISTANT:\n{assistant content}\n\n
 *     ...
 *     ASSISTANT:\n                  <- the model continues from here
 *
 * and the reply stops at the turn end ("\n\n", a stop string of the
 * request's own), so it is one speech. The speaker names, the speaker line's
 * end and the turn end are the model's chat template (POST /v1/models
 * "chat_template"); a message's "name" speaks instead of its role's name.
 *
 * The prompt is encoded piece by piece, not rendered and then encoded: a
 * character outside the vocabulary is named where the client sent it
 * (messages[2].content), or as the template's when it is the template's.
 * The rest is /v1/completions' path (route_infer.c's task_* blocks): one
 * generation task through the scheduler, a session if one is named.
 */
#define _GNU_SOURCE
#include "server.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A conversation's bounds; the bytes are bounded by --max-body, its tokens
 * by --max-prompt (413). */
#define CHAT_MAX_MESSAGES 1024
#define CHAT_MAX_PARTS 256   /* text parts of one message's content */
#define CHAT_MAX_NAME 64     /* a message's "name" */
/* max_completion_tokens when the request has none: a speech, which the
 * turn end usually ends well before (and never past --max-tokens). */
#define CHAT_DEFAULT_MAX_TOKENS 256

static const char *const roles[3] = {"system", "user", "assistant"};

/* ------------------------------------------------------------ templates */

void chat_template_default(chat_template_t *c)
{
    snprintf(c->system, sizeof c->system, "SYSTEM");
    snprintf(c->user, sizeof c->user, "USER");
    snprintf(c->assistant, sizeof c->assistant, "ASSISTANT");
    snprintf(c->speaker_end, sizeof c->speaker_end, ":\n");
    snprintf(c->turn_end, sizeof c->turn_end, "\n\n");
}

static char *role_name(chat_template_t *c, int role)
{
    return role == 0 ? c->system : role == 1 ? c->user : c->assistant;
}

/* The string at K of J into OUT (at most CHAT_FIELD_MAX bytes; at least
 * MIN); absent or null keeps OUT. */
static int template_str(json_t *j, const char *k, const char *what, size_t min, char *out, char *err)
{
    json_t *v = json_object_get(j, k);
    if (!v || json_is_null(v)) return 0;
    size_t n = json_is_string(v) ? json_string_length(v) : 0;
    if (!json_is_string(v) || n < min || n > CHAT_FIELD_MAX)
        return snprintf(err, 512, "chat_template.%s%s must be a string of %zu to %d bytes", what, k, min, CHAT_FIELD_MAX), -1;
    memcpy(out, json_string_value(v), n + 1);
    return 0;
}

/* Every key of J is one of KEYS (N): a misspelt setting is never silently
 * ignored. */
static int known_keys(json_t *j, const char *const *keys, int n, const char *what, char *err)
{
    const char *k;
    json_t *v;
    json_object_foreach(j, k, v) {
        int known = 0;
        for (int i = 0; i < n; i++) known |= strcmp(k, keys[i]) == 0;
        if (!known) return snprintf(err, 512, "chat_template%s has no setting '%.64s'", what, k), -1;
    }
    return 0;
}

int chat_template_parse(json_t *j, chat_template_t *c, char *err)
{
    static const char *const keys[] = {"roles", "speaker_end", "turn_end"};
    chat_template_default(c);
    if (!j || json_is_null(j)) return 0;
    if (!json_is_object(j)) return snprintf(err, 512, "chat_template must be an object"), -1;
    if (known_keys(j, keys, 3, "", err)) return -1;
    json_t *r = json_object_get(j, "roles");
    if (r && !json_is_null(r)) {
        if (!json_is_object(r)) return snprintf(err, 512, "chat_template.roles must be an object"), -1;
        if (known_keys(r, roles, 3, ".roles", err)) return -1;
        for (int i = 0; i < 3; i++)
            if (template_str(r, roles[i], "roles.", 0, role_name(c, i), err)) return -1;
    }
    /* the turn end is the reply's stop string: never empty */
    return template_str(j, "speaker_end", "", 0, c->speaker_end, err) || template_str(j, "turn_end", "", 1, c->turn_end, err)
               ? -1 : 0;
}

json_t *chat_template_json(const chat_template_t *c)
{
    return json_pack("{s:{s:s, s:s, s:s}, s:s, s:s}", "roles", "system", c->system, "user", c->user, "assistant",
                     c->assistant, "speaker_end", c->speaker_end, "turn_end", c->turn_end);
}

int chat_template_check(const chat_template_t *c, const vocab_t *v, char *err)
{
    const char *parts[5] = {c->system, c->user, c->assistant, c->speaker_end, c->turn_end};
    static const char *const names[5] = {"roles.system", "roles.user", "roles.assistant", "speaker_end", "turn_end"};
    for (int i = 0; i < 5; i++) {
        int32_t *ids;
        size_t n;
        char e2[ERR_LEN];
        if (vocab_encode_prompt(v, parts[i], strlen(parts[i]), &ids, &n, e2))
            return snprintf(err, 512, "chat_template.%s: %s", names[i], e2), -1;
        free(ids);
    }
    return 0;
}

/* ------------------------------------------------------------ messages */

static int role_of(json_t *m)
{
    const char *r = json_string_value(json_object_get(m, "role"));
    for (int i = 0; r && i < 3; i++)
        if (strcmp(r, roles[i]) == 0) return i;
    return -1;
}

/* The shape of "messages", before anything is bound (400). */
static int check_messages(json_t *msgs, char *err)
{
    if (!json_is_array(msgs) || json_array_size(msgs) == 0 || json_array_size(msgs) > CHAT_MAX_MESSAGES)
        return snprintf(err, 512, "messages must be an array of 1 to %d messages", CHAT_MAX_MESSAGES), -1;
    for (size_t i = 0; i < json_array_size(msgs); i++) {
        json_t *m = json_array_get(msgs, i), *name = json_object_get(m, "name"), *c = json_object_get(m, "content");
        if (!json_is_object(m)) return snprintf(err, 512, "messages[%zu] must be an object with role and content", i), -1;
        if (role_of(m) < 0) return snprintf(err, 512, "messages[%zu].role must be system, user or assistant", i), -1;
        if (name && !json_is_null(name) &&
            (!json_is_string(name) || json_string_length(name) == 0 || json_string_length(name) > CHAT_MAX_NAME))
            return snprintf(err, 512, "messages[%zu].name must be a string of 1 to %d bytes", i, CHAT_MAX_NAME), -1;
        if (json_is_string(c)) continue;
        if (!json_is_array(c) || json_array_size(c) > CHAT_MAX_PARTS)
            return snprintf(err, 512, "messages[%zu].content must be a string or an array of at most %d text parts", i,
                            CHAT_MAX_PARTS), -1;
        for (size_t k = 0; k < json_array_size(c); k++) {
            json_t *p = json_array_get(c, k);
            const char *type = json_string_value(json_object_get(p, "type"));
            if (!type || strcmp(type, "text") != 0 || !json_is_string(json_object_get(p, "text")))
                return snprintf(err, 512, "messages[%zu].content[%zu] must be a text part, {\"type\": \"text\", \"text\": "
                                "STRING}: these models read text only", i, k), -1;
        }
    }
    return 0;
}

typedef struct {
    int32_t *ids;
    size_t n, cap;
} toks_t;

/* Appends the tokens of S; 422 naming WHAT for a character outside the
 * vocabulary. */
static int put(const vocab_t *v, toks_t *o, const char *s, size_t len, const char *what, char *err)
{
    int32_t *ids;
    size_t n;
    char e2[ERR_LEN];
    if (!len) return 0;   /* an empty name, speaker end or content */
    if (vocab_encode_prompt(v, s, len, &ids, &n, e2)) return snprintf(err, 512, "%s: %s", what, e2), 422;
    if (o->n + n > o->cap) {
        size_t cap = (o->n + n) * 2;
        int32_t *p = realloc(o->ids, cap * sizeof *p);
        if (!p) return free(ids), snprintf(err, 512, "out of memory"), 503;
        o->ids = p;
        o->cap = cap;
    }
    memcpy(o->ids + o->n, ids, n * sizeof *ids);
    o->n += n;
    free(ids);
    return 0;
}

/* A speaker line of SM's template: the message's NAME, or else its ROLE's
 * name, and the speaker end. Errors name the template's own pieces as the
 * model's, and say what to do. */
static int put_speaker(const vocab_t *v, toks_t *o, const smodel_t *sm, json_t *name, int role, size_t i, char *err)
{
    char what[160];
    const char *s = json_string_value(name);
    if (s) snprintf(what, sizeof what, "messages[%zu].name", i);
    else {
        s = role == 0 ? sm->chat.system : role == 1 ? sm->chat.user : sm->chat.assistant;
        snprintf(what, sizeof what, "the chat template of model '%s' (roles.%s; load the model with a chat_template its "
                 "vocabulary can write)", sm->name, roles[role]);
    }
    int status = put(v, o, s, strlen(s), what, err);
    if (!status) {
        snprintf(what, sizeof what, "the chat template of model '%s' (speaker_end)", sm->name);
        status = put(v, o, sm->chat.speaker_end, strlen(sm->chat.speaker_end), what, err);
    }
    return status;
}

/* The conversation MSGS as T's prompt tokens, written with its model's
 * template (the header comment). 0, or an HTTP status with ERR. */
static int render(task_t *t, json_t *msgs, char *err)
{
    const smodel_t *sm = t->sm;
    const vocab_t *v = &sm->m->vocab;
    toks_t o = {0};
    char what[64], te[160];
    snprintf(te, sizeof te, "the chat template of model '%s' (turn_end)", sm->name);
    int status = 0;
    for (size_t i = 0; !status && i < json_array_size(msgs); i++) {
        json_t *m = json_array_get(msgs, i), *c = json_object_get(m, "content");
        status = put_speaker(v, &o, sm, json_object_get(m, "name"), role_of(m), i, err);
        if (!status && json_is_string(c)) {
            snprintf(what, sizeof what, "messages[%zu].content", i);
            status = put(v, &o, json_string_value(c), json_string_length(c), what, err);
        }
        for (size_t k = 0; !status && json_is_array(c) && k < json_array_size(c); k++) {
            json_t *text = json_object_get(json_array_get(c, k), "text");
            snprintf(what, sizeof what, "messages[%zu].content[%zu].text", i, k);
            status = put(v, &o, json_string_value(text), json_string_length(text), what, err);
        }
        if (!status) status = put(v, &o, sm->chat.turn_end, strlen(sm->chat.turn_end), te, err);
        if (!status && o.n > (size_t)srv.cfg.max_prompt)   /* stop early: task_fits says so */
            break;
    }
    if (!status) status = put_speaker(v, &o, sm, NULL, 2, 0, err);
    t->toks = o.ids;   /* the task frees them */
    t->n = o.n;
    return status;
}

/* ------------------------------------------------------------ the route */

enum MHD_Result route_chat_completions(request_t *r)
{
    json_t *b = body_json(r);
    if (!b) return MHD_YES;
    task_t *t = task_new(TASK_GENERATE, API_CHAT);
    if (!t) { json_decref(b); return reply_error(r, 503, "out of memory"); }
    char err[512];
    const char *model, *session;
    long long top, n;
    int logprobs, status;
    json_t *msgs = json_object_get(b, "messages"), *so = json_object_get(b, "stream_options");
    json_t *mct = json_object_get(b, "max_completion_tokens"), *mt = json_object_get(b, "max_tokens");
    int new_name = mct && !json_is_null(mct);
    if (new_name && mt && !json_is_null(mt))
        return task_refuse(r, t, b, 400, "give max_completion_tokens or max_tokens (its older name), not both");
    if (field_str(b, "model", &model, err) || field_str(b, "session", &session, err) ||
        field_bool(b, "stream", 0, &t->stream, err) || field_bool(b, "logprobs", 0, &logprobs, err) ||
        field_int(b, "top_logprobs", 0, GEN_MAX_TOP, -1, &top, err) || field_int(b, "n", 1, 1, 1, &n, err) ||
        task_sampling(b, t, new_name ? "max_completion_tokens" : "max_tokens", CHAT_DEFAULT_MAX_TOKENS, err) ||
        check_messages(msgs, err))
        return task_refuse(r, t, b, 400, err);
    if (top >= 0 && !logprobs) return task_refuse(r, t, b, 400, "top_logprobs needs logprobs: true");
    t->top_n = logprobs ? (top > 0 ? (int)top : 0) : -1;
    if (so && !json_is_null(so)) {
        if (!json_is_object(so)) return task_refuse(r, t, b, 400, "stream_options must be an object");
        if (!t->stream) return task_refuse(r, t, b, 400, "stream_options is for stream: true");
        if (field_bool(so, "include_usage", 0, &t->include_usage, err)) return task_refuse(r, t, b, 400, err);
    }
    snprintf(t->cmpl_id, sizeof t->cmpl_id, "chatcmpl-%016llx",
             (unsigned long long)t->gp.seed ^ (unsigned long long)(now_s() * 1e6));
    if ((status = task_bind(t, model, session, err)) || (status = render(t, msgs, err)) ||
        (status = task_fits(t, t->gp.max_tokens, err)))
        return task_refuse(r, t, b, status, err);
    /* the reply is one turn: it ends where the template ends a turn */
    if (!(t->stop_buf[t->gp.n_stop] = strdup(t->sm->chat.turn_end))) return task_refuse(r, t, b, 503, "out of memory");
    t->gp.n_stop++;
    if ((status = task_generate_start(t, session != NULL, err))) return task_refuse(r, t, b, status, err);
    if (t->stream)   /* the first chunk says who speaks */
        task_event(t, NULL, chat_chunk(t, NULL, 0));
    return task_submit(r, t, b);
}

/* ------------------------------------------------------------ answers */

/* One token of a chat logprobs entry: the token (its text, LEN bytes at S), its logprob and bytes. */
static json_t *lp_token(const char *s, size_t len, float lp)
{
    json_t *bytes = json_array();
    for (size_t i = 0; i < len; i++) json_array_append_new(bytes, json_integer((unsigned char)s[i]));
    return json_pack("{s:s%, s:f, s:o}", "token", s, len, "logprob", (double)lp, "bytes", bytes);
}

/* OpenAI's chat logprobs over the generated tokens [FROM, TO). */
static json_t *chat_logprobs(const task_t *t, size_t from, size_t to)
{
    json_t *content = json_array();
    char *buf = malloc(vocab_max_piece(&t->sm->m->vocab) + 1);
    for (size_t i = from; buf && i < to; i++) {
        int32_t id;
        float lp;
        const int32_t *ti;
        const float *tl;
        task_token(t, i, &id, &lp, &ti, &tl);
        json_t *e = lp_token(buf, task_token_text(t, i, id, buf), lp), *tops = json_array();
        for (int k = 0; k < t->g.top_n; k++) json_array_append_new(tops, lp_token(buf, task_token_text(t, i, ti[k], buf), tl[k]));
        json_object_set_new(e, "top_logprobs", tops);
        json_array_append_new(content, e);
    }
    free(buf);
    return json_pack("{s:o}", "content", content);
}

json_t *chat_json(const task_t *t)
{
    json_t *lp = t->top_n >= 0 ? chat_logprobs(t, 0, (size_t)t->res.n_text_tokens) : json_null();
    json_t *j = json_pack("{s:s, s:s, s:I, s:s, s:[{s:i, s:{s:s, s:s%}, s:o, s:s}]}", "id", t->cmpl_id, "object",
                          "chat.completion", "created", (json_int_t)t->created, "model", t->sm->name, "choices", "index", 0,
                          "message", "role", "assistant", "content", t->res.text ? t->res.text : "", t->res.text_len,
                          "logprobs", lp, "finish_reason", task_finish(t));
    json_object_set_new(j, "usage", task_usage(t));
    return j;
}

/* A chat.completion.chunk: DELTA, LP and FINISH for the one choice, or no
 * choice at all when DELTA is NULL (the usage chunk). */
static json_t *chunk_new(const task_t *t, json_t *delta, json_t *lp, const char *finish)
{
    json_t *j = json_pack("{s:s, s:s, s:I, s:s, s:[]}", "id", t->cmpl_id, "object", "chat.completion.chunk", "created",
                          (json_int_t)t->created, "model", t->sm->name, "choices");
    if (delta)
        json_array_append_new(json_object_get(j, "choices"), json_pack("{s:i, s:o, s:o, s:s?}", "index", 0, "delta", delta,
                                                                       "logprobs", lp, "finish_reason", finish));
    if (t->include_usage)   /* OpenAI's: null on every chunk but the last */
        json_object_set_new(j, "usage", delta ? json_null() : task_usage(t));
    return j;
}

/* The chunk of PIECE (just counted in t->sent_bytes) with the logprobs of
 * exactly its tokens; PIECE NULL: the first chunk, the assistant's role. */
json_t *chat_chunk(task_t *t, const char *piece, size_t len)
{
    if (!piece) return chunk_new(t, json_pack("{s:s, s:s}", "role", "assistant", "content", ""), json_null(), NULL);
    json_t *lp = json_null();
    if (t->top_n >= 0) {
        size_t from, to = task_stream_tokens(t, &from);
        lp = chat_logprobs(t, from, to);
    }
    return chunk_new(t, json_pack("{s:s%}", "content", piece, len), lp, NULL);
}

void chat_stream_final(task_t *t)
{
    task_event(t, NULL, chunk_new(t, json_object(), json_null(), task_finish(t)));
    if (t->include_usage) task_event(t, NULL, chunk_new(t, NULL, NULL, NULL));
}
