/*
 * train_family.c - the trainer's table of model families (train.h's
 * train_family). Adding a family touches its own file, this table, and its
 * tests; the config parser, the loop and the job server find it here by the
 * name a config gives.
 *
 *   adaptive-span       train_aspan.c   Sukhbaatar et al. 2019
 *   par-transformer-xl  train_par.c     Mandava et al. 2020
 */
#include "train.h"

#include <string.h>

const train_family *const train_families[] = {&train_family_aspan, &train_family_par, NULL};

const train_family *train_family_find(const char *name)
{
    for (int i = 0; name && train_families[i]; i++)
        if (strcmp(train_families[i]->name, name) == 0) return train_families[i];
    return NULL;
}

const char *train_family_names(char *buf, size_t cap, int cuda_only, const char *quote)
{
    int n = 0, k = 0;
    for (int i = 0; train_families[i]; i++) n += !cuda_only || train_families[i]->cuda;
    size_t len = 0;
    buf[0] = 0;
    for (int i = 0; train_families[i] && len < cap; i++) {
        if (cuda_only && !train_families[i]->cuda) continue;
        const char *sep = k == 0 ? "" : k == n - 1 ? " or " : ", ";
        int w = snprintf(buf + len, cap - len, "%s%s%s%s", sep, quote, train_families[i]->name, quote);
        len += w > 0 ? (size_t)w : 0;
        k++;
    }
    return buf;
}
