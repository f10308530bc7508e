/* keeps kvp_testlib non-empty */ typedef int kvp_testlib_empty_t;
