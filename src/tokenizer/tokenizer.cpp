#include "kvboost/tokenizer.h"
